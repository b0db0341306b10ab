# Sa2VA SFT settings in one place (reference/sa2va.md §6, upstream projects/llava_sam2/configs/sa2va_4b.py).
#
# Inheritance: every config in configs/rl/ reads this file with MMEngine's read_base(), the form that works with
# XTuner's lazy pure-Python configs (`from ... import Class`, `type=Class`); the old `_base_ = [...]` list is not
# accepted for them:
#
#     from mmengine.config import read_base
#     with read_base():
#         from ._base_.sa2va_sft_base import *
#
# The base's variables arrive as copies: change a nested setting through its dict
# (`optim_wrapper.optimizer.update(lr=1e-5)`, `model.update(preset='tiny')`); values computed from another variable
# (param_scheduler from max_iters) are written again by a child that changes that variable. Configs hold data
# only: a function defined here would break MMEngine's config dump.
from mmengine.hooks import DistSamplerSeedHook, IterTimerHook, LoggerHook, ParamSchedulerHook
from mmengine.optim import AmpOptimWrapper, CosineAnnealingLR, LinearLR
from torch.optim import AdamW

from projects.llava_sam2.rl_train.engine.hooks import AtomicCheckpointHook
from projects.llava_sam2.rl_train.engine.train_model import Sa2VATrainModel

# ---- model --------------------------------------------------------------------------------------------------
# Trainable set of upstream SFT (model/network/lora.py configure_trainable): LoRA on every LLM linear layer, mlp1, the
# SAM2 mask decoder and text_hidden_fcs; the vision encoder, the LLM base weights and the SAM2 image encoder stay
# frozen. The chat template (1B qwen_chat, 4B phi3_chat, 8B internlm2_chat) and the special tokens
# ([SEG] <p> </p> <vp> </vp>) come from the checkpoint's config.json and tokenizer, never from here. SFT items are
# encoded by Sa2VAProcessor.encode_fn (video_lisa_encode_fn semantics) and batched by Sa2VAProcessor.sft_collate.
model = dict(
    type=Sa2VATrainModel,
    pretrained_path=None,  # children: a local HF Sa2VA checkpoint directory, or preset=...
    lora=dict(r=128, lora_alpha=256, lora_dropout=0.05),  # upstream LoraConfig (alpha = 2 r)
    train_embeddings=False,  # upstream SFT also trains embed_tokens / lm_head (2 x vocab x D more weights)
    gradient_checkpointing=True,  # recompute LLM activations in backward: memory for ~30% more compute
    torch_dtype="bfloat16",  # frozen weights; the trained tensors stay fp32 (trainable_dtype, the optimizer's masters)
    processor_cfg=dict(empty_region="raise"),  # region under one 16x16 cell: raise | keep | dilate_to_one_cell
)
max_length = 8192  # SFT tokens per sample

# ---- optimizer and schedule ---------------------------------------------------------------------------------
optim_wrapper = dict(
    type=AmpOptimWrapper,
    # no paramwise config: weight decay hits every trained tensor, as upstream
    optimizer=dict(type=AdamW, lr=4e-5, betas=(0.9, 0.999), weight_decay=0.05),
    clip_grad=dict(max_norm=1.0, error_if_nonfinite=False),
    accumulative_counts=4,  # SFT micro-batches per optimizer step
    # bf16 autocast over fp32 master weights (the model's trainable_dtype): bf16 has fp32's exponent range, so the
    # loss needs no scaling (upstream's "dynamic" scaler exists for fp16). Set loss_scale="dynamic" with dtype="float16".
    loss_scale=dict(enabled=False),
    dtype="bfloat16",
)
max_iters = 10000


# Upstream schedule: LinearLR from 1e-5 x lr over the first 5% of the iterations, then cosine to 0. A child that
# changes max_iters writes these two entries again with its own numbers (MMEngine's LinearLR reaches the full lr
# at its last step, so give the warmup at least 2 iterations).
warmup_iters = int(0.05 * max_iters)
param_scheduler = [
    dict(type=LinearLR, start_factor=1e-5, by_epoch=False, begin=0, end=warmup_iters),
    dict(type=CosineAnnealingLR, eta_min=0.0, by_epoch=False, begin=warmup_iters, end=max_iters),
]

# ---- hooks and runtime --------------------------------------------------------------------------------------
default_hooks = dict(
    timer=dict(type=IterTimerHook),
    logger=dict(type=LoggerHook, log_metric_by_epoch=False, interval=10),
    param_scheduler=dict(type=ParamSchedulerHook),
    # upstream: every 1000 iterations, keep the last 2, weights only. AtomicCheckpointHook takes CheckpointHook's
    # arguments and saves crash-safely (temporary name, fsync, rename; the older checkpoint is pruned only after
    # the new one is complete; docs/failure_behaviour.md)
    checkpoint=dict(type=AtomicCheckpointHook, save_optimizer=False, by_epoch=False, interval=1000, max_keep_ckpts=2),
    sampler_seed=dict(type=DistSamplerSeedHook),
)
custom_hooks = []
env_cfg = dict(cudnn_benchmark=False, mp_cfg=dict(mp_start_method="fork", opencv_num_threads=0),
               dist_cfg=dict(backend="nccl"))
visualizer = None
log_level = "INFO"
load_from = None
resume = False
randomness = dict(seed=None, deterministic=False)
log_processor = dict(by_epoch=False)
