# The demo's GRPO (grpo_shapes_cpu.py) plus loop 1's dense mask loss: the policy segments each of its own sampled
# captions (RES prompt, teacher-forced "[SEG]" answer) and a Dice + BCE loss pulls that mask toward the input region,
# on the rollouts with positive advantage (GRPOConfig mask_to_caption_dense_*, grpo/dense.py). The loop-2 action
# stays `region`. Measured against the region-only default in docs/mask_action.md ("Dense mask objectives").
#
#   sa2va-rl demo --seed 100 --rl-config projects/llava_sam2/configs/rl/demo/grpo_shapes_dense_cpu.py
from mmengine.config import read_base

with read_base():
    from .grpo_shapes_cpu import *  # noqa: F401,F403

train_cfg.algorithm.config.update(  # noqa: F405
    mask_to_caption_dense_weight=1.0,  # upstream SFT's mask-loss scale beside a policy-gradient term of order 1
    mask_to_caption_dense_rollouts="positive",
)
