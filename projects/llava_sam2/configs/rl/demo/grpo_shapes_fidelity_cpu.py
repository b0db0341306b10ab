# Demo control: the demo's GRPO (grpo_shapes_cpu.py) with a caption-fidelity term in loop 1's reward, METEOR of the
# policy's caption against the ground-truth caption beside the cycle IoU. docs/demo.md ("What limits it"): loop 1's
# cycle IoU alone pays a colour-only caption as well as a true one, because the partner picks objects by colour.
#
#   sa2va-rl demo --work-dir work_dirs/exp_fidelity --seed 0 \
#       --rl-config projects/llava_sam2/configs/rl/demo/grpo_shapes_fidelity_cpu.py
from mmengine.config import read_base

with read_base():
    from .grpo_shapes_cpu import *  # noqa: F401,F403

from projects.llava_sam2.rl_train.rewards import IoUReward, MeteorReward  # noqa: E402

train_cfg.algorithm.rewards.mask_to_caption = [  # noqa: F405
    dict(type=IoUReward, weight=1.0),  # IoU(gt_mask, partner's mask for the caption): the cycle term
    dict(type=MeteorReward, weight=0.5),  # METEOR(policy caption, gt_caption): keeps the caption true
]
