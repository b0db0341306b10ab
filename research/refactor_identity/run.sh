#!/usr/bin/env bash
# Byte-identity of a refactor: a 3-iteration demo GRPO run (pretrained tiny Sa2VA, 8 shapes scenes, dense loop-1 loss)
# and two held-out evaluations (the pretrained checkpoint on all four tasks; the GRPO checkpoint through its config),
# reduced to one digest file: the trained state dict's tensor bytes, every logged scalar except wall-clock ones, and
# the evaluation records and metrics (the output path masked). Run it on two checkouts and diff the digests:
#
#   research/refactor_identity/run.sh /path/to/old/checkout /tmp/old
#   research/refactor_identity/run.sh /path/to/new/checkout /tmp/new
#   diff /tmp/old/digest.txt /tmp/new/digest.txt && echo identical
#
# Needs the project's venv (PYTHON, default .venv/bin/python of the checkout this script lives in) and WordNet.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
PY=${PYTHON:-$HERE/../../.venv/bin/python}
export PYTHONPATH=$REPO TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 OMP_NUM_THREADS=1
export NLTK_DATA=${NLTK_DATA:-$HERE/../../.cache/nltk_data}
cd "$REPO"
CONFIG=projects/llava_sam2/configs/rl/demo/_identity_grpo_cpu.py
cp "$HERE/identity_grpo_cpu.py" "$CONFIG"
trap 'rm -f "$REPO/$CONFIG"' EXIT
CLI="$PY -m projects.llava_sam2.rl_train.cli"
$CLI train "$CONFIG" --work-dir "$OUT/grpo" > "$OUT/train.log" 2>&1
$CLI evaluate --checkpoint projects/llava_sam2/rl_train/assets/tiny_shapes_pretrained --dataset shapes --split test \
    --num-samples 8 --tasks res caption cycle_iou cycle_caption --out "$OUT/eval_pretrained" --n-resamples 50 \
    --no-progress > "$OUT/eval_pretrained.log" 2>&1
$CLI evaluate --config "$CONFIG" --weights "$OUT/grpo/iter_3.pth" --dataset shapes --split test --num-samples 4 \
    --tasks res cycle_iou --out "$OUT/eval_grpo" --n-resamples 50 --no-progress > "$OUT/eval_grpo.log" 2>&1
"$PY" "$HERE/digest.py" "$OUT"
