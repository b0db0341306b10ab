# Tiny dual-loop GRPO on the shapes world, on CPU in under a minute: the demo and the CI check of the whole
# stack (config -> XTuner trainer -> GRPOLoop -> CycleGRPO -> tiny Sa2VA). Random weights: it shows that
# everything runs and every trainable tensor gets a gradient, not that the model learns.
#
#   sa2va-rl train projects/llava_sam2/configs/rl/tiny_grpo_cycle_cpu.py --work-dir work_dirs/tiny_grpo
#   PYTHON=.venv/bin/python tools/dist_train.sh projects/llava_sam2/configs/rl/tiny_grpo_cycle_cpu.py 2
from mmengine.config import read_base

with read_base():
    from ._base_.datasets.shapes_regions import region_collate_fn, shapes_region_dataset
    from ._base_.sa2va_grpo_base import *  # noqa: F401,F403
    from ._base_.cpu_runtime import *  # noqa: F401,F403  fp32 OptimWrapper, gloo, seed 0
    from ._base_.tiny_model_cpu import *  # noqa: F401,F403  the tiny preset: fp32, LoRA r=8

# small groups, short captions and partner answers
train_cfg.algorithm.config.update(num_generations=2, max_completion_length=6)  # noqa: F405
train_cfg.algorithm.update(seg_answer_max_tokens=4)  # noqa: F405
max_iters = 4
train_cfg.update(max_iters=max_iters)  # noqa: F405
param_scheduler = [
    dict(type=LinearLR, start_factor=1e-5, by_epoch=False, begin=0, end=2),  # noqa: F405
    dict(type=CosineAnnealingLR, eta_min=0.0, by_epoch=False, begin=2, end=max_iters),  # noqa: F405
]

# 8 shapes scenes of 64 px
shapes_region_dataset.update(num_samples=8, image_size=64)
train_dataloader.update(batch_size=2, num_workers=0, persistent_workers=False,  # noqa: F405
                        dataset=shapes_region_dataset, collate_fn=region_collate_fn)

# a checkpoint and a rollout table every 2 iterations
default_hooks.checkpoint.update(interval=2)  # noqa: F405
default_hooks.rollout_logging.update(interval=2, max_prompts=2, max_rollouts=2)  # noqa: F405
