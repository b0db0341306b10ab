# CPU runtime, shared by the CPU configs (tiny_*_cpu.py, demo/*_cpu.py). Read it in `read_base()` after the SFT or
# GRPO base, because it replaces three of the base's entries:
#
#     with read_base():
#         from ._base_.sa2va_grpo_base import *  # noqa: F401,F403
#         from ._base_.cpu_runtime import *  # noqa: F401,F403
#
# * optim_wrapper: fp32 OptimWrapper (AmpOptimWrapper needs CUDA), one optimizer step per batch, with the SFT base's
#   AdamW and gradient clipping (a child changes them through `optim_wrapper.optimizer.update(lr=...)`);
# * env_cfg: gloo instead of nccl for multi-process runs;
# * randomness: seed 0, so a CPU run, its resume and its export (preset weights are re-initialised from the seed)
#   are reproducible.
# The model's CPU settings (torch_dtype=None, gradient_checkpointing=False) stay with each config's model (the tiny
# configs read theirs from tiny_model_cpu.py).
from mmengine.config import read_base

with read_base():
    from .sa2va_sft_base import env_cfg, optim_wrapper

from mmengine.optim import OptimWrapper

optim_wrapper = dict(type=OptimWrapper, optimizer=optim_wrapper.optimizer, clip_grad=optim_wrapper.clip_grad,
                     accumulative_counts=1)
env_cfg.update(dist_cfg=dict(backend="gloo"))
randomness = dict(seed=0)
