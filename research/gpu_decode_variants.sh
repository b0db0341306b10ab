#!/bin/bash
# Issue #28 item 4 on one H100: the bare 4b LM's rollout decode (B=8, G=8, 1,850-token prompts, 128 new tokens) with
# each decode-step variant of model/decoding/decode_plan.py and the baselines, in one call of at most ~8 minutes.
# Run from the repository root (the device has no network; the stack's wheels are carried in .whl/):
#   BUDGET_S=460 bash research/gpu_decode_variants.sh
# It installs .whl/*.whl into /tmp/site (--no-index --no-deps) unless that was done before, then runs, each stage one
# `sa2va-rl bench decode` process under `timeout` inside the BUDGET_S wall-clock budget, in priority order:
#   G   CUDA-graph modes in one process: fast (baseline), fast+pad, fast+pad+fuse, fast+pad+fuse+split,
#       fast+pad+fuse+sdpa; 3 timed calls each, an 8-step kernel profile, each variant's greedy/seeded tokens
#       against fast (16 tokens)
#   C   Inductor-compiled modes in one process, in priority order: fast_compiled+pad+fuse+split (the candidate for
#       >= 10k tokens/s), fast_compiled (the compiled baseline), fast_compiled+pad+fuse
#   F   fast_compiled+pad+fuse+flex, if time is left
# Each bench runs with --keep-going and rewrites its JSON after every mode: a stage cut by its timeout keeps the
# modes it finished, and a variant that raises is listed under "errors".
# The compiled stages profile a 71-token call and check 72 tokens: the timed calls' cache shape, so nothing
# recompiles after the first call (first_call_s in the JSON is that call: compile included).
# JSON per stage, logs and stages.txt go to $OUT (decode_<stage>.json); $OUT/summary.txt holds the table printed last.
# CPU dry run of the plumbing: PY=<venv python> LM=tiny SHAPE="--device cpu --batch 2 --num-generations 2 --prompt-len 24
#   --new-tokens 8" CHECK_T=8 PROFILE_T=7 STAGES=G bash research/gpu_decode_variants.sh
set -u
START=$(date +%s)
BUDGET_S=${BUDGET_S:-460}
OUT=${OUT:-$PWD/out_decode}
mkdir -p "$OUT"
: > "$OUT/stages.txt"
PY=${PY:-python3}  # the interpreter with torch (on the device: the preinstalled python3)
export PYTHONUNBUFFERED=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_decode
if ls .whl/*.whl > /dev/null 2>&1 && [ ! -f /tmp/site/.decode_variants_installed ]; then
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1 \
    && touch /tmp/site/.decode_variants_installed
fi
export PYTHONPATH=/tmp/site:$PWD
LM=${LM:-4b}
SHAPE=${SHAPE:-"--batch 8 --num-generations 8 --prompt-len 1850 --new-tokens 128"}
# compiled stages: 1850 + 72 (check) and 1850 + 1 + 70 (profile) tokens round up to the timed calls' 1,984 cache
# slots (1850 + 128), so these calls reuse the compiled step instead of compiling a second shape
CHECK_T=${CHECK_T:-72}
PROFILE_T=${PROFILE_T:-70}
STAGES=${STAGES:-"G C F"}
BENCH="$PY -m projects.llava_sam2.rl_train.cli bench decode --lm $LM $SHAPE --repeats 3 --keep-going"

left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
wants() { [[ " $STAGES " == *" $1 "* ]]; }
# run_stage NAME CAP_S MIN_S MODES ARGS...: `bench decode --modes MODES ARGS` under timeout min(CAP_S, time left)
run_stage() {
  local name=$1 cap=$2 min=$3 modes=$4; shift 4
  wants "$name" || return
  local t=$(left)
  [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt "$min" ]; then echo "stage $name skipped: ${t}s left" | tee -a "$OUT/stages.txt"; return; fi
  echo "stage $name: timeout ${t}s: --modes $modes $*" | tee -a "$OUT/stages.txt"
  local s0=$(date +%s)
  timeout --kill-after=10 "$t" $BENCH --modes "$modes" --json "$OUT/decode_$name.json" "$@" > "$OUT/$name.log" 2>&1
  echo "stage $name: rc=$? wall=$(( $(date +%s) - s0 ))s" | tee -a "$OUT/stages.txt"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1

COMPILED=(--profile-steps "$PROFILE_T" --check-tokens "$CHECK_T" --check-scope variants)
run_stage G 160 60 fast,fast+pad,fast+pad+fuse,fast+pad+fuse+split,fast+pad+fuse+sdpa \
  --profile-steps 8 --check-tokens 16 --check-scope variants
run_stage C 330 90 fast_compiled+pad+fuse+split,fast_compiled,fast_compiled+pad+fuse "${COMPILED[@]}"
run_stage F 120 70 fast_compiled+pad+fuse+flex "${COMPILED[@]}"

"$PY" - "$OUT" > "$OUT/summary.txt" 2>&1 <<'EOF'
import glob, json, os, sys

out = sys.argv[1]
print(f"{'stage':<6}{'mode':<30}{'tok/s':>9}{'step ms':>9}{'first s':>9}{'peak GiB':>9}{'kern/step':>10}"
      f"{'dev ms/step':>12}  check against fast (greedy / seeded tokens equal, first token)")
for path in sorted(glob.glob(os.path.join(out, "decode_*.json"))):
    report = json.load(open(path))
    stage = os.path.basename(path)[len("decode_"):-len(".json")]
    for mode, r in report["modes"].items():
        prof = report.get("profile", {}).get(mode, {})
        chk = report.get("check", {}).get(mode, {})
        agreement = (f"{chk['greedy_tokens_equal_fast']:.3f} / {chk['sampled_tokens_equal_fast']:.3f}, "
                     f"{chk['greedy_first_token_equal_fast']:.3f}" if chk else "")
        print(f"{stage:<6}{mode:<30}{r['tokens_per_s']:>9.0f}{r['decode_step_ms']:>9.2f}{r['first_call_s']:>9.1f}"
              f"{r['peak_gib']:>9.1f}{prof.get('kernels_per_step', float('nan')):>10.0f}"
              f"{prof.get('device_ms_per_step', float('nan')):>12.3f}  {agreement}")
    for mode, error in report.get("errors", {}).items():
        print(f"{stage:<6}{mode:<30}failed: {error[:200]}")
    print(f"{stage:<6}device: {report['config']['device_name']}, torch {report['config']['torch']}")
EOF
cat "$OUT/stages.txt" "$OUT/summary.txt"
echo "total wall: $(( $(date +%s) - START ))s"
