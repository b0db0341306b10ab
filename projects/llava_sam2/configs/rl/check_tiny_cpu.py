# The CPU stand-in of gpu_smoke_1b.py for `sa2va-rl check gpu --cpu` (and its CI test): the tiny random-weights
# config with the smoke config's rewards (loop 1: IoU + the judge on the policy's caption; loop 2: METEOR + judge),
# so every check compares runs with a non-zero loss when the judge answers vary (the check's stub server).
from mmengine.config import read_base

with read_base():
    from .tiny_grpo_cycle_cpu import *  # noqa: F401,F403

train_cfg.algorithm.rewards.mask_to_caption = [  # noqa: F405
    dict(type=IoUReward, weight=1.0),  # noqa: F405
    dict(type=DLCJudgeReward, weight=0.5, judge=dict(max_concurrency=8, timeout_s=60.0)),  # noqa: F405
]
