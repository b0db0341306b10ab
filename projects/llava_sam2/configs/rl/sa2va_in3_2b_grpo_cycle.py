# Dual-loop GRPO (cycle RL) of Sa2VA-InternVL3-2B (upstream codebase v2: InternViT-300M + Qwen2.5-1.5B, qwen_chat) on
# describe-anything (DLC) regions (_base_/sa2va_grpo_cycle_dlc.py), launched like upstream SFT, then exported to the
# HF layout upstream's v2 code reads:
#
#   DEEPSPEED=deepspeed_zero2 tools/dist_train.sh projects/llava_sam2/configs/rl/sa2va_in3_2b_grpo_cycle.py 8
#   sa2va-rl export projects/llava_sam2/configs/rl/sa2va_in3_2b_grpo_cycle.py \
#       work_dirs/sa2va_in3_2b_grpo_cycle/iter_2000.pth --save-path work_dirs/Sa2VA-InternVL3-2B-RL
#
# The released HF checkpoint is read from the local directory ./pretrained/Sa2VA-InternVL3-2B (edit to your copy).
# LoRA r 128 / alpha 256: upstream's v2 SFT setting for this size (docs/sa2va_internals.md §9).
from mmengine.config import read_base

with read_base():
    from ._base_.sa2va_grpo_cycle_dlc import *  # noqa: F401,F403

model.update(pretrained_path="./pretrained/Sa2VA-InternVL3-2B")  # noqa: F405
