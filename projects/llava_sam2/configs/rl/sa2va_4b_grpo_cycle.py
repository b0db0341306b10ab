# Dual-loop GRPO (cycle RL) of Sa2VA-4B on describe-anything (DLC) regions, launched like upstream SFT:
#
#   DEEPSPEED=deepspeed_zero2 tools/dist_train.sh projects/llava_sam2/configs/rl/sa2va_4b_grpo_cycle.py 8
#   python tools/export_hf.py projects/llava_sam2/configs/rl/sa2va_4b_grpo_cycle.py \
#       work_dirs/sa2va_4b_grpo_cycle/iter_2000.pth --save-path work_dirs/Sa2VA-4B-RL
#
# Paths are local placeholders: a released HF checkpoint in ./pretrained/Sa2VA-4B and the DLC data in
# data/describe-anything-dataset (_base_/datasets/dlc_regions.py). Loop 2's judge is the OpenAI-compatible
# endpoint in $JUDGE_BASE_URL / $JUDGE_MODEL; without one it falls back to METEOR, logged every iteration.
from mmengine.config import read_base

with read_base():
    from ._base_.datasets.dlc_regions import dlc_region_dataset, region_collate_fn
    from ._base_.sa2va_grpo_base import *  # noqa: F401,F403

model.update(pretrained_path="./pretrained/Sa2VA-4B")  # noqa: F405
train_dataloader.update(dataset=dlc_region_dataset, collate_fn=region_collate_fn)  # noqa: F405

max_iters = 2000
train_cfg.update(max_iters=max_iters)  # noqa: F405
warmup_iters = int(0.05 * max_iters)
param_scheduler = [
    dict(type=LinearLR, start_factor=1e-5, by_epoch=False, begin=0, end=warmup_iters),  # noqa: F405
    dict(type=CosineAnnealingLR, eta_min=0.0, by_epoch=False, begin=warmup_iters, end=max_iters),  # noqa: F405
]
