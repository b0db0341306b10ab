# The field's dense mask recipe on both loops of the demo's GRPO (grpo_shapes_cpu.py): loop 1's Dice + BCE of the
# policy's segmentation of its own positive-advantage captions against the input region (grpo_shapes_dense_cpu.py)
# and loop 2's deterministic [SEG] mask with self-training toward the group's best (grpo_shapes_deterministic_cpu.py).
#
#   sa2va-rl demo --seed 100 --rl-config projects/llava_sam2/configs/rl/demo/grpo_shapes_field_cpu.py
from mmengine.config import read_base

with read_base():
    from .grpo_shapes_cpu import *  # noqa: F401,F403

train_cfg.algorithm.config.update(  # noqa: F405
    mask_to_caption_dense_weight=1.0,
    mask_to_caption_dense_rollouts="positive",
    mask_policy="deterministic",
    caption_to_mask_dense_weight=1.0,
)
