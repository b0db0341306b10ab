#!/bin/bash
# The GT-free prompt-RL line (docs/prompt_rl.md) on an existing Sa2VA checkpoint instead of the tiny segmenter that
# step 0 trains from scratch (issue #12, deliverable 5): quality data -> reward network + free baselines -> prompt
# policies (PPO, LinUCB, reranking, fixed prompts, oracle) -> logit post-processing -> report. Same sizes as the
# doc's main table: 200 ShapesWorld('val', seed 0) images at the dataset default of 224 px (the tiny preset's tile
# size; the same images and held-out split as the doc's text-blind run), K = 11 prompts, 40% of the images held out.
# The GRPO fine-tuning step (5) is not part of this script.
# Usage, from the repository root (CPU, one thread; about 3 minutes):
#   bash research/prompt_rl_from_checkpoint.sh CKPT RUN_DIR
# Leaves RUN_DIR/{quality,reward_net,policy,postprocess,report}/, RUN_DIR/report/prompt_rl_report.md and
# RUN_DIR/run_info.json (checkpoint sha256, git commit, seconds per step).
set -eu
if [ $# -ne 2 ]; then
  echo "usage: bash $0 CKPT RUN_DIR   (CKPT: a Sa2VA checkpoint dir with config.json, weights and tokenizer)" >&2
  exit 2
fi
CKPT=$1
RUN=$2
if [ ! -f "$CKPT/config.json" ]; then
  echo "$CKPT: no config.json; pass a save_pretrained checkpoint directory" >&2
  exit 2
fi
PY=${PYTHON:-.venv/bin/python}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
mkdir -p "$RUN"
TIMES="$RUN/step_seconds.tsv"
: > "$TIMES"

step() {  # step NAME ARGS...: run `python -m projects.llava_sam2.rl_train.cli prompt-rl ARGS`, log to RUN/NAME.log
  local name=$1 t0 t1
  shift
  t0=$(date +%s%N)
  echo "== $name: $*"
  "$PY" -m projects.llava_sam2.rl_train.cli prompt-rl "$@" > "$RUN/$name.log" 2>&1 || {
    echo "step $name failed; see $RUN/$name.log" >&2; tail -20 "$RUN/$name.log" >&2; exit 1; }
  t1=$(date +%s%N)
  printf '%s\t%d.%d\n' "$name" $(((t1 - t0) / 1000000000)) $(((t1 - t0) / 100000000 % 10)) | tee -a "$TIMES"
}

step quality quality-dataset "$CKPT" "$RUN/quality" --num-images 200 --num-prompts 11 --heldout-fraction 0.4 --seed 0
step reward_net reward-net "$RUN/quality" "$RUN/reward_net" --seed 0
step policy policy "$RUN/quality" "$RUN/reward_net" "$RUN/policy" --seed 0
step postprocess postprocess "$RUN/quality" "$RUN/postprocess" --seed 0
step report report --run-dir "$RUN"

"$PY" - "$CKPT" "$RUN" <<'PY'
import hashlib, json, subprocess, sys
from pathlib import Path
ckpt, run = Path(sys.argv[1]), Path(sys.argv[2])
weights = sorted(ckpt.glob("*.safetensors")) or sorted(ckpt.glob("*.bin"))
info = {"checkpoint": str(ckpt),
        "sha256": {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in weights},
        "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "step_seconds": {name: float(seconds) for name, seconds in
                         (line.split("\t") for line in (run / "step_seconds.tsv").read_text().splitlines() if line)}}
(run / "run_info.json").write_text(json.dumps(info, indent=1))
print(json.dumps(info))
PY
echo "report: $RUN/report/prompt_rl_report.md"
