# grpo_shapes_dense_cpu.py with a tenth of the dense weight: at weight 1.0 loop 1's Dice + BCE term (~0.4) is two
# orders of magnitude above the policy-gradient term (~0.003) and dominates the update (docs/mask_action.md).
#
#   sa2va-rl demo --seed 100 --rl-config projects/llava_sam2/configs/rl/demo/grpo_shapes_dense_light_cpu.py
from mmengine.config import read_base

with read_base():
    from .grpo_shapes_dense_cpu import *  # noqa: F401,F403

train_cfg.algorithm.config.update(mask_to_caption_dense_weight=0.1)  # noqa: F405
