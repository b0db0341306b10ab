# Dual-loop GRPO (cycle RL) on describe-anything (DLC) regions: the settings the sa2va_{1b,4b,8b}_grpo_cycle
# configs share. They differ only in the checkpoint they start from (as upstream SFT configs do).
# The data path is a local default to edit (_base_/datasets/dlc_regions.py: data/describe-anything-dataset).
# Loop 2's judge is the OpenAI-compatible endpoint in $JUDGE_BASE_URL / $JUDGE_MODEL; without one it falls back
# to METEOR, counted and logged every iteration.
from mmengine.config import read_base

with read_base():
    from .datasets.dlc_regions import dlc_region_dataset, region_collate_fn
    from .sa2va_grpo_base import *  # noqa: F401,F403

train_dataloader.update(dataset=dlc_region_dataset, collate_fn=region_collate_fn)  # noqa: F405

# EMA partner + reference snapshot in pinned host memory: 0 GPU bytes instead of ~24% of the bf16 model for
# LoRA r=128 at 4B, for ~0.1 s per EMA update (docs/benchmarks.md)
model.update(weights_storage_device="cpu")  # noqa: F405

max_iters = 2000
train_cfg.update(max_iters=max_iters)  # noqa: F405
# the fused LM-head log-prob (model/decoding/head_logprob.py): equal to the reference head within 1e-5 in fp32,
# bit-equal log-probs under bf16 autocast, ~1 s a step less at 4b on an H100 (docs/benchmarks.md); the CPU
# configs keep the reference head the demo's recorded numbers were made with
train_cfg["algorithm"]["config"]["logprob_head"] = "fused"  # noqa: F405
# length buckets (docs/speed.md): prompts left padded to a multiple of 64 tokens, captions right padded to a multiple
# of 32, so a run meets a few shapes instead of paying first-shape costs on every new batch; the padding is masked
# (equal log-probs and gradients within float reordering); the CPU configs keep exact lengths, as recorded
train_cfg["algorithm"]["config"].update(prompt_length_multiple=64, completion_length_multiple=32)  # noqa: F405
# decode on merged LoRA weights with joined q|k|v and gate|up GEMMs, the head padded to a multiple of 64 rows, and
# each prompt's (or shared image prefix's) cache read once per step for all its rows by prefix_attention's Triton
# kernels (model/decoding/decode_plan.py), the step compiled by torch.compile before its graph capture: the same tokens
# as 'fast' in fp32 (Inductor may reorder float math); on an H100 the bare 4b decode goes from 6.9k to 9.4k tokens/s and
# holds ~4 GiB less than the full-row cache, and the 4b step's two long decodes take ~0.4 s less (docs/speed.md); the
# first step's decodes compile (~80 s at 1b on an H100), later lengths reuse the graph
train_cfg["algorithm"]["config"]["decode_backend"] = "fast_fused_split_compiled"  # noqa: F405
# the loss pass's decoder layers stay eager: compiled (compile_loss_layers=True) they train on one GPU, under DDP and
# under DeepSpeed ZeRO-2 on 2 H100s, but the 4b step was not faster with them (docs/benchmarks.md, Round 7)
train_cfg["algorithm"]["config"]["compile_loss_layers"] = False  # noqa: F405
warmup_iters = int(0.05 * max_iters)
param_scheduler = [
    dict(type=LinearLR, start_factor=1e-5, by_epoch=False, begin=0, end=warmup_iters),  # noqa: F405
    dict(type=CosineAnnealingLR, eta_min=0.0, by_epoch=False, begin=warmup_iters, end=max_iters),  # noqa: F405
]
