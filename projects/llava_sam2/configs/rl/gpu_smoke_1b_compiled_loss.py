# The GPU smoke config with the loss pass's decoder layers compiled (GRPOConfig.compile_loss_layers): what `sa2va-rl
# check gpu --config projects/llava_sam2/configs/rl/gpu_smoke_1b_compiled_loss.py` runs for that switch (DDP and ZeRO-2
# failed at the first compile of the round-4 code and train since the fixes; docs/speed.md, "Compiled decoder layers
# in the loss pass"). The released configs keep the layers eager: compiled, the 4b step was not faster.
from mmengine.config import read_base

with read_base():
    from .gpu_smoke_1b import *  # noqa: F401,F403

train_cfg.algorithm.config.update(compile_loss_layers=True)  # noqa: F405
