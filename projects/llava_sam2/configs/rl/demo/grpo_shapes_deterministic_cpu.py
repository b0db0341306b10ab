# The demo's GRPO (grpo_shapes_cpu.py) with the field's deterministic loop-2 mask: no sampled mask cells; the policy
# samples its answer text to the RES prompt (GRPO on those tokens) and the mask is the greedy mask of the answer's
# [SEG]; a Dice + BCE self-training loss pulls each rollout's mask toward the mask whose partner description scored
# best in its group (GRPOConfig mask_policy='deterministic', caption_to_mask_dense_weight; grpo/dense.py). Measured
# against the `region` default in docs/mask_action.md ("Dense mask objectives").
#
#   sa2va-rl demo --seed 100 --rl-config projects/llava_sam2/configs/rl/demo/grpo_shapes_deterministic_cpu.py
from mmengine.config import read_base

with read_base():
    from .grpo_shapes_cpu import *  # noqa: F401,F403

train_cfg.algorithm.config.update(  # noqa: F405
    mask_policy="deterministic",
    caption_to_mask_dense_weight=1.0,
)
