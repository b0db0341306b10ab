#!/bin/bash
# Fourth GPU run of demo/pretrain_tiny.py (issue #12, text gap target 0.30; docs/benchmarks.md, "Pretraining the tiny
# Sa2VA"): continue the committed checkpoint (session 3's cont_both) with more sam + joint steps, three ways side by
# side. The held-out evaluation of each run is on ShapesWorld('val', seed=0); pick among them on seed 1 (CPU,
# evaluation/text_dependence.py --seed 1) so the reported seed-0 numbers are not the ones that chose.
# Usage, from the repository root with nltk_data/corpora/wordnet.zip under $NLTK_ROOT:
#   bash research/pretrain_round4.sh TIME_LIMIT_S KILL_AFTER_S NLTK_ROOT
set -u
TL=${1:-460}
KILL=${2:-530}
NLTK_ROOT=${3:-$PWD/nltk_data}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 NLTK_DATA=$NLTK_ROOT
(cd "$NLTK_ROOT/corpora" && python3 -m zipfile -e wordnet.zip .)  # the project's METEOR wants corpora/wordnet/
CKPT=projects/llava_sam2/rl_train/assets/tiny_shapes_pretrained
COMMON="--seed 0 --device cuda --num-workers 4 --time-limit-s $TL --attribute-share 0.5 --log-every 200 --init $CKPT"
declare -A VARIANT=(
  [more_b32]="--scenes-per-batch 32 --sam-steps 6000 --joint-steps 6000 --sam-lr 7e-4 --joint-lr 4e-4"
  [more_b64]="--scenes-per-batch 64 --sam-steps 6000 --joint-steps 6000 --sam-lr 7e-4 --joint-lr 4e-4"
  [joint_b64]="--scenes-per-batch 64 --sam-steps 0 --joint-steps 8000 --joint-lr 4e-4 --teacher-weight 0"
)
mkdir -p runs logs
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > logs/gpu.txt 2>&1
for name in "${!VARIANT[@]}"; do
  timeout $KILL python3 -m projects.llava_sam2.rl_train.demo.pretrain_tiny --out runs/$name $COMMON ${VARIANT[$name]} \
    > logs/$name.log 2>&1 &
done
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv -l 30 > logs/gpu_util.txt 2>&1 &
wait -n; wait -n; wait -n
kill %4 2>/dev/null
python3 -m research.pretrain_summary --out "$OUT" "${!VARIANT[@]}"
