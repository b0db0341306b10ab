# The tiny Sa2VA on CPU, shared by the tiny_*_cpu.py configs: the `tiny` preset with random weights (a child that
# starts from a checkpoint sets pretrained_path and preset=None), fp32 weights, no activation recomputation, a small
# LoRA, and regions that may cover less than one region cell. Its `model` is the SFT base's with these settings and
# replaces the one a base read before it brings, so read it after the SFT or GRPO base:
#
#     with read_base():
#         from ._base_.sa2va_grpo_base import *  # noqa: F401,F403
#         from ._base_.cpu_runtime import *  # noqa: F401,F403
#         from ._base_.tiny_model_cpu import *  # noqa: F401,F403
from mmengine.config import read_base

with read_base():
    from .sa2va_sft_base import model

model.update(
    pretrained_path=None, preset="tiny", torch_dtype=None, gradient_checkpointing=False,
    lora=dict(r=8, lora_alpha=16, lora_dropout=0.05),
    processor_cfg=dict(empty_region="dilate_to_one_cell"),  # tiny shapes can cover less than one region cell
)
