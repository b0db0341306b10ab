# The GPU smoke config with the log-prob passes' layer loop replayed from CUDA graphs (GRPOConfig.graph_loss_layers):
# what `sa2va-rl check gpu --config projects/llava_sam2/configs/rl/gpu_smoke_1b_layer_graphs.py` runs to check the
# graphs under DDP and DeepSpeed ZeRO-2 (model/decoding/layer_graphs.py, docs/speed.md).
from mmengine.config import read_base

with read_base():
    from .gpu_smoke_1b import *  # noqa: F401,F403

train_cfg.algorithm.config.update(graph_loss_layers=True)  # noqa: F405
