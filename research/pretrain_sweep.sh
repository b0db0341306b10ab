#!/bin/bash
# Recipe sweep of demo/pretrain_tiny.py on one GPU (issue #12; research/LOG.md, "Pretraining the tiny Sa2VA").
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
python3 -m research.pretrain_summary --out "$OUT" "${!VARIANT[@]}"
