# Demo control: the demo's GRPO (grpo_shapes_cpu.py) with loop 1 rewarded by the cycle IoU alone, as in the
# product's base config (_base_/sa2va_grpo_base.py), without the demo's caption-fidelity term. docs/demo.md ("Loop
# 1's reward") compares the two.
#
#   sa2va-rl demo --work-dir work_dirs/exp_cycle_only --seed 0 \
#       --rl-config projects/llava_sam2/configs/rl/demo/grpo_shapes_cycle_only_cpu.py
from mmengine.config import read_base

with read_base():
    from .grpo_shapes_cpu import *  # noqa: F401,F403

from projects.llava_sam2.rl_train.rewards import IoUReward  # noqa: E402

train_cfg.algorithm.rewards.mask_to_caption = [dict(type=IoUReward, weight=1.0)]  # noqa: F405
