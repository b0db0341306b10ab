#!/bin/bash
# Second GPU run of demo/pretrain_tiny.py (issue #12; research/LOG.md, "Pretraining the tiny Sa2VA on one H100"): the
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
python3 -m research.pretrain_summary --out "$OUT" "${!VARIANT[@]}"
