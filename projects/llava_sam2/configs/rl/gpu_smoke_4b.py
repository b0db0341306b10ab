# The GPU smoke config at the 4B shape (InternViT-300M + Phi-3-mini-sized LLM + SAM2-L, random weights) with the
# step of the speed benchmarks: B = 8 prompts and G = 8 rollouts per prompt and loop on every GPU. `sa2va-rl check gpu
# --preset 4b` measures rollouts/s and peak memory per GPU on 1 and 2 GPUs with it (docs/gpu.md).
from mmengine.config import read_base

with read_base():
    from .gpu_smoke_1b import *  # noqa: F401,F403

model.update(preset="4b")  # noqa: F405
train_cfg.algorithm.config.update(max_completion_length=128)  # noqa: F405
train_dataloader.update(batch_size=8)  # noqa: F405
