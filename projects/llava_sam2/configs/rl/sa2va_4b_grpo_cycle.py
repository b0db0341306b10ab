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
# the loss pass keeps the last 8 decoder layers' activations instead of recomputing them in backward (docs/speed.md,
# "Partial activation checkpointing"): ~0.1 s a step less in the bench's 4b step (8 prompts a GPU), for ~18 GiB more at
# that size; at this config's 2 prompts a rank ~5 GiB
train_cfg["algorithm"]["config"]["uncheckpointed_layers"] = 8  # noqa: F405
