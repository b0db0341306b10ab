from mmengine.config import read_base

with read_base():
    from .check_tiny_cpu import *  # noqa: F401,F403

train_cfg.algorithm.config.update(compile_loss_layers=True, decode_backend="fast_fused_split")  # noqa: F405
