#!/bin/bash
# Recipe sweep of demo/pretrain_tiny.py on one GPU (issue #12; docs/benchmarks.md, "Pretraining the tiny Sa2VA").
# Runs the variants side by side (one process each, 2 batch-building workers each), then packs the logs and
# every checkpoint into $OUT. Usage, from a directory holding `projects/` (and nltk_data/ for caption METEOR):
#   bash pretrain_sweep.sh TIME_LIMIT_S KILL_AFTER_S
set -u
TL=${1:-330}
KILL=${2:-450}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 NLTK_DATA=${NLTK_DATA:-$PWD/nltk_data}
RUN="timeout $KILL python3 -m projects.llava_sam2.rl_train.demo.pretrain_tiny --seed 0 --device cuda --num-workers 2
     --time-limit-s $TL --sam-steps 3000 --joint-steps 6000 --eval-every 1000 --log-every 100"
declare -A VARIANT=(
  [teacher]=""
  [natural]="--attribute-share 0 --teacher-weight 0"
  [noteacher]="--teacher-weight 0"
  [nogroup]="--no-group-by-scene"
  [nosam]="--sam-steps 0 --teacher-weight 0"
  [lm]="--lm-steps 1000"
)
mkdir -p runs logs
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > logs/gpu.txt 2>&1
for name in "${!VARIANT[@]}"; do
  $RUN --out runs/$name ${VARIANT[$name]} > logs/$name.log 2>&1 &
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
    print(path, stages, "train_s", log["train_seconds"],
          "gap", td.get("gap", {}).get("value"), "ident", td.get("identical_share", {}).get("value"),
          "own", td.get("own_iou", {}).get("value"),
          {t: {k: round(v["value"], 3) for k, v in m.items()} for t, m in tasks.items()})
PY
