#!/bin/bash
# Issue #23's first look at the oracle and at source-SFT, on the VALIDATION split: SFT of the committed tiny Sa2VA
# (configs/rl/demo/sft_shapes_cpu.py, its recipe unless options say otherwise) on paired scenes, export, and
# `sa2va-rl evaluate` on the first 100 target-domain val scenes. Data as `sa2va-rl demo --eval-split val` writes it
# (DATA_DIR/train: paired target scenes, DATA_DIR/eval: target val scenes); SOURCE=1 trains on DATA_DIR/source_train
# (paired source scenes, e.g. written by `sa2va-rl demo-controls --controls source_sft`) instead.
#   bash research/domain_sft_probe.sh DATA_DIR OUT_DIR ITERS LR [more --cfg-options ...]
set -eu
DATA=$1; W=$2; IT=$3; LR=$4; shift 4
CFG=projects/llava_sam2/configs/rl/demo/sft_shapes_cpu.py
TRAIN=$DATA/train/annotations.json; [ "${SOURCE:-0}" = 1 ] && TRAIN=$DATA/source_train/annotations.json
WARMUP=$(( IT / 30 > 1 ? IT / 30 : 1 ))
OPTS="randomness.seed=${SEED:-100} train_dataloader.dataset.region_dataset.ann_file=$TRAIN train_cfg.max_iters=$IT
 param_scheduler.0.end=$WARMUP param_scheduler.1.begin=$WARMUP param_scheduler.1.end=$IT
 default_hooks.checkpoint.interval=$IT optim_wrapper.optimizer.lr=$LR $*"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
python -m projects.llava_sam2.rl_train.cli train $CFG --work-dir "$W" --cfg-options $OPTS
python -m projects.llava_sam2.rl_train.cli export $CFG "$W" --save-path "$W/hf" --cfg-options $OPTS
python -m projects.llava_sam2.rl_train.cli evaluate --checkpoint "$W/hf" --dataset coco \
    --ann-file "$DATA/eval/annotations.json" --name target_val --num-samples 100 --out "$W/eval_val" \
    --batch-size 16 --max-new-tokens 24 --no-progress
