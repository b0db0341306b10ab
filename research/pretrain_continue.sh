#!/bin/bash
# Third GPU run of demo/pretrain_tiny.py (issue #12; research/LOG.md, "Pretraining the tiny Sa2VA"): continue the
# committed checkpoint (the second run's sam_heavy) with more sam/joint steps, beside a longer run from scratch.
# Usage, from the repository root with nltk_data/corpora/wordnet.zip under $NLTK_ROOT:
#   bash research/pretrain_continue.sh TIME_LIMIT_S KILL_AFTER_S NLTK_ROOT
set -u
TL=${1:-400}
KILL=${2:-500}
NLTK_ROOT=${3:-$PWD/nltk_data}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 NLTK_DATA=$NLTK_ROOT
(cd "$NLTK_ROOT/corpora" && python3 -m zipfile -e wordnet.zip .)  # the project's METEOR wants corpora/wordnet/
CKPT=projects/llava_sam2/rl_train/assets/tiny_shapes_pretrained
COMMON="--seed 0 --device cuda --num-workers 4 --time-limit-s $TL --scenes-per-batch 32 --attribute-share 0.5
        --log-every 200"
declare -A VARIANT=(
  [cont_both]="--init $CKPT --sam-steps 4000 --lm-steps 0 --joint-steps 4000 --sam-lr 1e-3 --joint-lr 5e-4"
  [cont_joint]="--init $CKPT --sam-steps 0 --lm-steps 0 --joint-steps 8000 --joint-lr 5e-4"
  [fresh_long]="--sam-steps 8000 --lm-steps 1000 --joint-steps 8000"
)
mkdir -p runs logs
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > logs/gpu.txt 2>&1
for name in "${!VARIANT[@]}"; do
  timeout $KILL python3 -m projects.llava_sam2.rl_train.demo.pretrain_tiny --out runs/$name $COMMON ${VARIANT[$name]} \
    > logs/$name.log 2>&1 &
done
wait
python3 -m research.pretrain_summary --out "$OUT" "${!VARIANT[@]}"
