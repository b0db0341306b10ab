# Tiny dual-loop GRPO on VIDEO (the shapes video world), on CPU: both cycle loops on clips (grpo/cycle.py). Loop 1
# captions the object on its key frame and the EMA partner segments the caption in the whole clip (SAM2 memory
# propagation), rewarded by J&F; loop 2 grounds a referring expression in the clip's first frames, samples the mask
# on the frame where the policy's mask is largest and the partner describes it there. Random weights: it shows that
# the video step runs end to end and trains, not that the model learns.
#
#   sa2va-rl train projects/llava_sam2/configs/rl/tiny_grpo_video_cpu.py --work-dir work_dirs/tiny_grpo_video
from mmengine.config import read_base

with read_base():
    from ._base_.datasets.video_shapes import region_collate_fn, shapes_video_dataset
    from ._base_.sa2va_grpo_base import *  # noqa: F401,F403
    from ._base_.cpu_runtime import *  # noqa: F401,F403  fp32 OptimWrapper, gloo, seed 0
    from ._base_.tiny_model_cpu import *  # noqa: F401,F403  the tiny preset: fp32, LoRA r=8

from projects.llava_sam2.rl_train.rewards import VideoJFReward

# small groups, short captions and partner answers; the language model sees the first 2 of each clip's 4 frames
train_cfg.algorithm.config.update(num_generations=2, max_completion_length=6, video_mllm_frames=2)  # noqa: F405
train_cfg.algorithm.update(seg_answer_max_tokens=4)  # noqa: F405
# loop 1 on video: J&F between the gt masklet and the partner's masklet (measure='j': mean J)
train_cfg.algorithm.rewards.update(mask_to_caption=[dict(type=VideoJFReward, weight=1.0, measure="jf")])  # noqa: F405
max_iters = 4
train_cfg.update(max_iters=max_iters)  # noqa: F405
param_scheduler = [
    dict(type=LinearLR, start_factor=1e-5, by_epoch=False, begin=0, end=2),  # noqa: F405
    dict(type=CosineAnnealingLR, eta_min=0.0, by_epoch=False, begin=2, end=max_iters),  # noqa: F405
]

# 8 clips of 4 frames at 64 px
shapes_video_dataset.update(num_samples=8, image_size=64, num_frames=4)
train_dataloader.update(batch_size=2, num_workers=0, persistent_workers=False,  # noqa: F405
                        dataset=shapes_video_dataset, collate_fn=region_collate_fn)

# a checkpoint every 2 iterations; the rollout table's image panels are image-only
default_hooks.checkpoint.update(interval=2)  # noqa: F405
default_hooks.rollout_logging.update(interval=2, max_prompts=2, max_rollouts=2)  # noqa: F405
