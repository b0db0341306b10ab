# Byte-identity check of a refactor (research/refactor_identity/run.sh copies it into the checkout under test): the demo GRPO on 8 in-memory shapes scenes, 3 iterations.
from mmengine.config import read_base

with read_base():
    from .grpo_shapes_cpu import *  # noqa: F401,F403

from projects.llava_sam2.rl_train.data import ShapesWorld  # noqa: E402

train_dataloader.update(batch_size=2)  # noqa: F405
train_dataloader["dataset"] = dict(type=ShapesWorld, split='train', num_samples=8, seed=0,  # noqa: F405
                                                   image_size=224, min_objects=1, max_objects=4)
train_cfg.algorithm.config.update(num_generations=4, mask_to_caption_dense_weight=1.0,  # noqa: F405
                                  mask_to_caption_dense_rollouts="positive")
max_iters = 3
train_cfg.update(max_iters=max_iters)  # noqa: F405
param_scheduler = [dict(type=LinearLR, start_factor=0.5, by_epoch=False, begin=0, end=max_iters)]  # noqa: F405
default_hooks.checkpoint.update(interval=max_iters, max_keep_ckpts=1)  # noqa: F405
default_hooks.rollout_logging.update(interval=2, max_prompts=2, max_rollouts=2)  # noqa: F405
