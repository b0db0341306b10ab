# Dual-loop GRPO on top of the Sa2VA SFT settings (docs/architecture.md): same model, LoRA, optimizer and hooks as
# sa2va_sft_base.py, with the train loop swapped for GRPOLoop and the GRPO hooks added. Children set the model
# (model.update(pretrained_path=...) or preset=...), the prompts (train_dataloader.update(dataset=...,
# collate_fn=...)) and max_iters (train_cfg.update(max_iters=...) and param_scheduler). Every hook has a name in
# default_hooks: a child changes one by name (`default_hooks.rollout_logging.update(interval=10)`, or
# `--cfg-options default_hooks.rollout_logging.interval=10`), never by its position in a list.
from mmengine.config import read_base

with read_base():
    from .sa2va_sft_base import *  # noqa: F401,F403

from mmengine.dataset import DefaultSampler

from projects.llava_sam2.rl_train.engine.hooks import (EMAPartnerHook, RewardFailureHook, RolloutLoggingHook,
                                                       SkippedSampleHook, TrainStateHook)
from projects.llava_sam2.rl_train.engine.loop import GRPOLoop
from projects.llava_sam2.rl_train.grpo.trainer import CycleGRPO
from projects.llava_sam2.rl_train.rewards import DLCJudgeReward, IoUReward, MeteorReward

train_cfg = dict(
    type=GRPOLoop,
    max_iters=max_iters,  # noqa: F405
    algorithm=dict(
        type=CycleGRPO,
        # GRPO knobs (TRL names); grpo/config.py GRPOConfig lists all of them with their defaults and help
        config=dict(
            # rollout
            num_generations=8,  # G rollouts per prompt and loop
            max_completion_length=128,  # caption tokens per rollout
            temperature=1.0,
            # loss
            loss_type="dapo",  # grpo | bnpo | dr_grpo | dapo
            beta=0.04,  # KL to the reference (SFT) policy; 0 skips the reference pass
            epsilon=0.2,
            num_iterations=1,  # optimisation passes over each batch of rollouts
            logprob_head="reference",  # LM-head log-probs: reference | fused (real tokens only, docs/speed.md)
            compile_loss_layers=False,  # torch.compile each decoder layer of the log-prob passes (docs/speed.md)
            uncheckpointed_layers=0,  # last decoder layers kept out of activation checkpointing (docs/speed.md)
            joint_loop_scoring=True,  # both loops' log-prob passes over one image prefix per sample (docs/speed.md)
            # rewards
            scale_rewards="group",  # group | batch | none
            mask_to_caption_weight=1.0,  # loop 1 (mask -> caption -> mask', IoU); 0 switches it off
            caption_to_mask_weight=1.0,  # loop 2 (caption -> mask -> caption', METEOR + judge)
            # partner
            ema_decay=0.999,  # EMA partner decay; EMAPartnerHook updates once per iteration, after its steps
            # loop-2 mask action (docs/mask_action.md): Bernoulli over the partner's g x g region cells, one clipped
            # ratio per mask (sequence level, sum of cell log-ratios / sqrt(T)); measured: every draw can change the
            # partner's input and loop 2's gradient on the shared trainables is of loop 1's scale
            mask_policy="region",  # region | bernoulli | gaussian_seg | multimask
            importance_sampling_level="token",  # loop 1 (captions): token | sequence (GSPO), TRL's knob
            mask_importance_sampling_level="sequence",  # loop 2: sequence | token | None (TRL's meaning of the above)
            # loop 2 at sequence level: None = sqrt (TRL/GSPO's mean when the level above is None) | sqrt | mean | sum
            mask_length_norm=None,
        ),
        # per loop, combined by RewardComposer (a failed reward falls back onto the others, counted and logged)
        rewards=dict(
            mask_to_caption=[dict(type=IoUReward, weight=1.0)],  # IoU(gt_mask, partner's mask')
            caption_to_mask=[  # partner's caption' against gt_caption
                dict(type=MeteorReward, weight=0.25),
                # OpenAI-compatible judge at $JUDGE_BASE_URL (model $JUDGE_MODEL); unset: METEOR only, counted
                dict(type=DLCJudgeReward, weight=0.75, judge=dict(max_concurrency=64, timeout_s=60.0)),
            ],
        ),
        minibatch_size=None,  # rollouts per loop and train_step; None: one minibatch per iteration
        seed=None,  # None: sample from the global RNG, which TrainStateHook checkpoints (exact resume)
    ),
    # a NaN/inf loss or gradient, or an update larger than max_update_ratio x the trainable weights' norm: the step
    # is skipped (weights, optimizer, EMA partner unchanged) and counted; max_consecutive_skips such iterations in a
    # row stop the run (docs/failure_behaviour.md)
    max_consecutive_skips=3,
    max_update_ratio=1.0,  # None: unchecked (keeps no copy of the trainable weights and optimizer state)
    # SFT mixing: each iteration adds sft_loss_weight x the SFT loss of one batch to its first minibatch, e.g.
    # sft_dataloader=dict(batch_size=2, num_workers=2, dataset=dict(type=region_sft_dataset, ...),
    #                     sampler=dict(type=DefaultSampler, shuffle=True), collate_fn=dict(type=sft_collate)),
    # sft_loss_weight=0.1,
)

# one optimizer step per minibatch (gradient accumulation counts minibatches, see GRPOLoop)
optim_wrapper.update(accumulative_counts=1)  # noqa: F405

# prompts per rank and iteration (each loop makes batch_size x num_generations rollouts); children set dataset
train_dataloader = dict(batch_size=2, num_workers=2, persistent_workers=True, dataset=None,
                        sampler=dict(type=DefaultSampler, shuffle=True), collate_fn=None)

# Named hooks: MMEngine registers every entry of default_hooks, its own names and new ones alike (mmdet names its
# `visualization` hook the same way), each at its class priority; these run after the SFT base's hooks of equal
# priority, as custom_hooks would.
default_hooks.update(  # noqa: F405
    logger=dict(type=LoggerHook, log_metric_by_epoch=False, interval=1),  # noqa: F405
    # exact resume needs the optimizer state (train_state and ema_partner save the RNG state and the partner);
    # AtomicCheckpointHook takes CheckpointHook's arguments and saves crash-safely (docs/failure_behaviour.md)
    checkpoint=dict(type=AtomicCheckpointHook, save_optimizer=True, by_epoch=False, interval=100,  # noqa: F405
                    max_keep_ckpts=2),
    ema_partner=dict(type=EMAPartnerHook),  # EMA partner update once per iteration (after its steps), checkpointed
    train_state=dict(type=TrainStateHook),  # RNG streams and sampler position in checkpoints (exact resume)
    reward_failures=dict(type=RewardFailureHook),  # judge timeouts / fallbacks, counted and logged
    skipped_samples=dict(type=SkippedSampleHook),  # samples a dataset with on_bad_sample='skip' left out
    rollout_logging=dict(type=RolloutLoggingHook, interval=50, max_prompts=4, max_rollouts=4),  # tables + PNGs
)
# loop 1 gives the mask decoder no gradient and some decoder heads never get one: DDP must allow it
model_wrapper_cfg = dict(type="MMDistributedDataParallel", find_unused_parameters=True)
