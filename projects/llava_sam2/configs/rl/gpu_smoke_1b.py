# GPU smoke test of an install: dual-loop GRPO of a 1B-shaped Sa2VA with random weights, nothing downloaded. It runs
# every launch path the real configs use (one GPU without DeepSpeed, DDP and ZeRO-2 over NCCL) with the real GPU
# settings of _base_/sa2va_grpo_base.py: bf16 weights with fp32 trained tensors under AmpOptimWrapper's bf16
# autocast, gradient checkpointing, EMA partner, KL reference, METEOR + the LLM judge (set JUDGE_BASE_URL, e.g. the
# project's stub server; unset, the judge falls back to METEOR and says so). `sa2va-rl check gpu` runs it on every
# path and checks parity and resume (docs/gpu.md).
#
#   sa2va-rl train projects/llava_sam2/configs/rl/gpu_smoke_1b.py --work-dir work_dirs/gpu_smoke_1b
#   tools/dist_train.sh projects/llava_sam2/configs/rl/gpu_smoke_1b.py 2
#   DEEPSPEED=deepspeed_zero2 tools/dist_train.sh projects/llava_sam2/configs/rl/gpu_smoke_1b.py 2
#
# Random weights: the numbers show that the stack runs, not that it learns. The shipped tiny tokenizer stands in for
# the real one (same special tokens and chat-template tokens), so the LM head has its 1,151 rows, not 151,679.
from mmengine.config import read_base

with read_base():
    from ._base_.datasets.shapes_regions import region_collate_fn, shapes_region_dataset
    from ._base_.sa2va_grpo_base import *  # noqa: F401,F403

from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer  # noqa: E402

model.update(  # noqa: F405
    pretrained_path=None, preset="1b", tokenizer=dict(type=load_tiny_tokenizer),
    # a tiny random shape can cover less than one 16 x 16 region cell of the 448 px input
    processor_cfg=dict(empty_region="dilate_to_one_cell"),
)
train_cfg.algorithm.config.update(num_generations=8, max_completion_length=32)  # noqa: F405
# the released-size configs' step (_base_/sa2va_grpo_cycle_dlc.py, docs/speed.md): length buckets, the fused LM-head
# log-prob and the compiled fused decode on the split prompt cache, so `check gpu` trains the path a GPU user runs
# (the loss pass's layers eager, as in the released configs)
train_cfg.algorithm.config.update(prompt_length_multiple=64, completion_length_multiple=32,  # noqa: F405
                                  logprob_head="fused", decode_backend="fast_fused_split_compiled",
                                  compile_loss_layers=False)
# loop 1 also asks the judge about the policy's own caption: with random weights the partner never answers with
# [SEG], so its IoU is 0 for every rollout, and the judge (answers that vary with the caption, from the check's
# stub server) gives the step a non-zero loss for the parity and resume comparisons
train_cfg.algorithm.rewards.mask_to_caption = [  # noqa: F405
    dict(type=IoUReward, weight=1.0),  # noqa: F405
    dict(type=DLCJudgeReward, weight=0.5, judge=dict(max_concurrency=64, timeout_s=60.0)),  # noqa: F405
]
train_cfg.algorithm.update(seg_answer_max_tokens=8)  # noqa: F405
max_iters = 10
train_cfg.update(max_iters=max_iters)  # noqa: F405
param_scheduler = [
    dict(type=LinearLR, start_factor=0.1, by_epoch=False, begin=0, end=2),  # noqa: F405
    dict(type=CosineAnnealingLR, eta_min=0.0, by_epoch=False, begin=2, end=max_iters),  # noqa: F405
]
# shapes scenes at the real 448 px input (one tile each)
shapes_region_dataset.update(num_samples=256, image_size=448)
train_dataloader.update(batch_size=4, num_workers=2, dataset=shapes_region_dataset,  # noqa: F405
                        collate_fn=region_collate_fn)
randomness = dict(seed=0)
# a checkpoint at iteration 5 and 10: `sa2va-rl check gpu` resumes from the first and compares iterations 6-10
default_hooks.checkpoint.update(interval=5, max_keep_ckpts=2)  # noqa: F405
default_hooks.rollout_logging.update(interval=5, max_prompts=2, max_rollouts=2)  # noqa: F405
