# Tiny Sa2VA SFT on the shapes world with XTuner's own TrainLoop, on CPU: the SFT forward of Sa2VATrainModel
# (upstream losses: LM cross-entropy + mask BCE + Dice) trained exactly as upstream SFT configs are, and the
# same model / optimizer / hooks settings the GRPO configs inherit.
#
#   sa2va-rl train projects/llava_sam2/configs/rl/tiny_sft_cpu.py --work-dir work_dirs/tiny_sft
from mmengine.config import read_base

with read_base():
    from ._base_.datasets.shapes_regions import shapes_region_dataset
    from ._base_.sa2va_sft_base import *  # noqa: F401,F403
    from ._base_.cpu_runtime import *  # noqa: F401,F403  fp32 OptimWrapper, gloo, seed 0
    from ._base_.tiny_model_cpu import *  # noqa: F401,F403  the tiny preset: fp32, LoRA r=8

from mmengine.dataset import DefaultSampler
from xtuner.engine.runner import TrainLoop

from projects.llava_sam2.rl_train.engine.builders import region_sft_dataset
from projects.llava_sam2.rl_train.model.text.processor import sft_collate

model.update(sft_loss_cfg=dict(num_points=256))  # noqa: F405  mask-loss points per mask (upstream 12544 for 256x256)

# caption and segment items of 8 shapes scenes, with the processor of the same tiny model
shapes_region_dataset.update(num_samples=8, image_size=64)
train_dataloader = dict(
    batch_size=2, num_workers=0,
    dataset=dict(type=region_sft_dataset, region_dataset=shapes_region_dataset, preset="tiny",
                 processor_cfg=dict(empty_region="dilate_to_one_cell"), tasks=("caption", "segment"), max_length=512),
    sampler=dict(type=DefaultSampler, shuffle=True),
    collate_fn=dict(type=sft_collate),
)

max_iters = 4
train_cfg = dict(type=TrainLoop, max_iters=max_iters)
param_scheduler = [
    dict(type=LinearLR, start_factor=1e-5, by_epoch=False, begin=0, end=2),  # noqa: F405
    dict(type=CosineAnnealingLR, eta_min=0.0, by_epoch=False, begin=2, end=max_iters),  # noqa: F405
]
default_hooks.logger.update(interval=1)  # noqa: F405
default_hooks.checkpoint.update(interval=2)  # noqa: F405
