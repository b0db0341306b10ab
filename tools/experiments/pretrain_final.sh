#!/bin/bash
# Second GPU run of demo/pretrain_tiny.py (issue #12; docs/benchmarks.md, "Pretraining the tiny Sa2VA"): the
# recipe the sweep (pretrain_sweep.sh) pointed to, with two splits of the time budget between stages, side by side.
# Usage, from a directory holding `projects/` and nltk_data/corpora/wordnet.zip:
#   bash pretrain_final.sh TIME_LIMIT_S KILL_AFTER_S
set -u
TL=${1:-280}
KILL=${2:-380}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 NLTK_DATA=$PWD/nltk_data
(cd nltk_data/corpora && python3 -m zipfile -e wordnet.zip .)  # the project's METEOR wants corpora/wordnet/
COMMON="--seed 0 --device cuda --num-workers 4 --time-limit-s $TL --scenes-per-batch 32 --attribute-share 0.5
        --lm-steps 1000 --log-every 100"
declare -A VARIANT=(
  [sam_heavy]="--sam-steps 6000 --joint-steps 4000"
  [joint_heavy]="--sam-steps 4000 --joint-steps 6000"
)
mkdir -p runs logs
for name in "${!VARIANT[@]}"; do
  timeout $KILL python3 -m projects.llava_sam2.rl_train.demo.pretrain_tiny --out runs/$name $COMMON ${VARIANT[$name]} \
    > logs/$name.log 2>&1 &
done
wait
for name in "${!VARIANT[@]}"; do cp runs/$name/pretrain_log.json logs/$name.json 2>/dev/null; done
tar czf "$OUT/logs.tgz" logs
for name in "${!VARIANT[@]}"; do tar cf "$OUT/ckpt_$name.tar" -C runs --exclude pretrain_log.json $name; done
python3 - <<'PY'
import glob, json
for path in sorted(glob.glob("logs/*.json")):
    log = json.load(open(path))
    td = log.get("held_out", {}).get("text_dependence", {})
    tasks = log.get("held_out", {}).get("tasks", {})
    stages = " ".join(f"{s['name']}:{s['steps_done']}/{s['planned_steps']}" for s in log["stages"])
    print(path, stages, "train_s", log["train_seconds"], "wall_s", log.get("wall_seconds"),
          {k: round(v["value"], 3) for k, v in td.items() if isinstance(v, dict)},
          {t: {k: round(v["value"], 3) for k, v in m.items()} for t, m in tasks.items()})
PY
