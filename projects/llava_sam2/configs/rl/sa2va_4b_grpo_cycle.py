# Dual-loop GRPO (cycle RL) of Sa2VA-4B on describe-anything (DLC) regions (_base_/sa2va_grpo_cycle_dlc.py),
# launched like upstream SFT, then exported to the HF layout:
#
#   DEEPSPEED=deepspeed_zero2 tools/dist_train.sh projects/llava_sam2/configs/rl/sa2va_4b_grpo_cycle.py 8
#   sa2va-rl export projects/llava_sam2/configs/rl/sa2va_4b_grpo_cycle.py \
#       work_dirs/sa2va_4b_grpo_cycle/iter_2000.pth --save-path work_dirs/Sa2VA-4B-RL
#
# The released HF checkpoint is read from the local directory ./pretrained/Sa2VA-4B (edit to your copy).
from mmengine.config import read_base

with read_base():
    from ._base_.sa2va_grpo_cycle_dlc import *  # noqa: F401,F403

model.update(pretrained_path="./pretrained/Sa2VA-4B")  # noqa: F405
