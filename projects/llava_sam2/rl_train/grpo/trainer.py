"""CycleGRPO: the framework-free algorithm object of a dual-loop GRPO step (a ``grpo.protocol.GRPOAlgorithm``).

The engine's ``GRPOLoop`` calls, per iteration::

    features = algo.encode(batch)                   # frozen encoders, once per image (StepFeatures)
    sampled = algo.rollout(features)                # SampledStep: one rollout per active loop, no grad, partner
                                                    # and reference inside
    scored = algo.score(sampled)                    # ScoredStep: rewards [B, G] + per-loop reward stats
    advantaged = algo.compute_advantages(scored)    # AdvantagedStep: group-normalised advantages
    for mb in algo.minibatches(advantaged):         # num_iterations x chunks
        runner.model.train_step({'grpo_batch': mb, 'algorithm': algo})   # -> algo.policy_loss(model, mb) in forward
    algo.after_optimizer_step()

Each stage returns a new value and leaves its input alone (grpo/rollout.py); the algorithm keeps no state between
stages, so a step's values can be scored and trained whatever else ran in between.

The algorithm owns ``weights`` (policy / EMA partner / reference over ``model``); ``EMAPartnerHook`` updates the
partner through them. Each loop has one name, ``mask_to_caption`` (loop 1) or ``caption_to_mask`` (loop 2): its
weight knob ``<name>_weight``, its ``rewards`` key, its rollouts' ``Rollout.loop`` and the prefix of its metrics
(``<name>/reward_mean``, ``<name>/pg_term``, ...).

Loss of a minibatch: ``mask_to_caption_weight * L1 + caption_to_mask_weight * L2``, each ``L`` the clipped GRPO
objective (the loop's ``PolicyLoss``: loop 1 at ``importance_sampling_level``, loop 2 at
``mask_importance_sampling_level`` / ``mask_length_norm``) of that loop's rows, plus the loop's dense mask loss when
its ``*_dense_weight`` is > 0 (``loop.loss_terms``; grpo/dense.py); a loop with weight 0 is not run at all. With
``mask_policy='deterministic'`` loop 2 is ``AnswerToMaskLoop`` (the answer text is the action, the mask the greedy
``[SEG]`` mask).

Minibatches: every minibatch holds the same prompt range of each active loop (whole groups), at most
``minibatch_size`` rollouts per loop. With several minibatches per rollout batch (or ``num_iterations > 1``) the
later ones are off-policy, so the rollout stores ``old_logp`` from a teacher-forced no-grad pass (with compiled
decoder layers, ``GRPOConfig.compile_loss_layers``, and dropout off, a pass of the loss's own code with grad on,
detached: the no-grad graph may round differently from the loss's); with one minibatch and one iteration
``old_logp`` is None and the loss uses ``logp.detach()`` (ratio exactly 1, same gradient, one forward fewer).
``dapo``'s normaliser is the loop's active elements of the global batch (all chunks, all ranks) divided by the number
of chunks and by the world size, so gradient accumulation over the chunks (MMEngine ``accumulative_counts``) and DDP's
gradient average give the token mean of the whole global batch (TRL's ``num_items_in_batch / num_processes``). The
cross-rank sums come from ``cross_rank_sum``, injected by the engine (``grpo/`` never imports ``torch.distributed``);
``scale_rewards='batch'`` uses it for the global batch std too.

Dropout: ``disable_dropout=True`` (TRL GRPOConfig's knob; False there, True here) sets p = 0 in every dropout
module of the model at build time (LoRA's 0.05 included), so rollouts (eval mode), ``old_logp`` / ``ref_logp`` and
the loss (train mode, LLM gradient checkpointing on) all score the same deterministic policy; with dropout the loss
would score a perturbed policy and the first ratio would not be 1. It is set on the modules rather than toggled
around the forward because checkpointed layers re-run their forward during ``backward()``, after the loss returned.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from ..model.decoding.grouped_scoring import (
    compile_group_layers, keep_last_layers_activations, supports_grouping, uses_compiled_layers)
from ..model.decoding.text_decoding import TextDecoding, eval_mode, group_chunks
from ..model.network.lora import check_compute_dtype
from ..model.pipeline.shared import SEG_ANSWER, is_qwen_vl_model, seg_answer_ids
from ..rewards import RewardComposer
from .advantages import group_advantages, reward_moments, std_from_moments
from .config import GRPOConfig
from .cycle import (
    AnswerToMaskLoop, CaptionToMaskLoop, CycleContext, MaskToCaptionLoop, caption_prefix_lengths, joint_action_logps)
from .features import StepFeatures, encode_step, loop_features
from .mask_policy import DETERMINISTIC_MASK, build_mask_policy
from .passes import slice_rows
from .rollout import AdvantagedStep, Rollout, SampledStep, ScoredStep

# Loop classes in step order; a loop runs when its config weight (``<name>_weight``) is > 0.
CYCLE_LOOPS = (MaskToCaptionLoop, CaptionToMaskLoop)

# Default rewards per loop (docs/architecture.md): IoU, loop 1; 0.25 METEOR + 0.75 judge for loop 2 (a judge without an
# endpoint returns None and the composer re-normalises onto METEOR).
DEFAULT_REWARDS = {
    "mask_to_caption": [dict(type="iou", weight=1.0)],
    "caption_to_mask": [dict(type="meteor", weight=0.25), dict(type="dlc_judge", weight=0.75)],
}
# What a video step scores with where it differs and the loop's rewards are the default: loop 1 compares masklets
# (J&F over the clip, rewards/video_metrics.py) instead of masks.
DEFAULT_VIDEO_REWARDS = {"mask_to_caption": [dict(type="video_jf", weight=1.0, measure="jf")]}


@dataclass
class LoopBatch:
    """One loop's rows of a minibatch.

    Attributes:
        loop: the loop object (``name``, ``weight``, ``action_logp``, ``loss_fn``).
        rollout: the loop's rollout restricted to whole groups ``samples`` (rows ``b * G + g``).
        samples: the prompt indices ``b`` of those groups.
        num_active_tokens: dapo's normaliser (global active elements / chunks / world size).
        features: the loop's rows of the step (``StepFeatures.select``: with unpaired data each loop has its own
            samples); None: the minibatch's features.
    """

    loop: Any
    rollout: Rollout
    samples: range
    num_active_tokens: float | None
    features: StepFeatures | None = None


@dataclass
class PolicyMinibatch:
    """What ``train_step({'grpo_batch': mb, 'algorithm': algo})`` carries: ``algo.policy_loss(model, mb)`` is its
    loss (the engine passes the algorithm beside the minibatch; a minibatch holds no reference to it)."""

    features: StepFeatures
    parts: list[LoopBatch]
    iteration: int


def _single_process_sum(values: Tensor) -> Tensor:
    """``cross_rank_sum`` of a single process: the values themselves."""
    return values


DROPOUT_TYPES = tuple(getattr(nn, name) for name in nn.modules.dropout.__all__)  # torch.nn's dropout modules


def zero_dropout(model: nn.Module) -> int:
    """Set p = 0 in every dropout module of ``model``; returns how many had p > 0."""
    changed = 0
    for module in model.modules():
        if isinstance(module, DROPOUT_TYPES) and module.p > 0:
            module.p, changed = 0.0, changed + 1
    return changed


def slice_groups(rollout: Rollout, b0: int, b1: int) -> Rollout:
    """The rollout's groups ``[b0, b1)``: rows ``[b0 * G, b1 * G)`` of every per-rollout tensor."""
    G = rollout.group_size
    r0, r1 = b0 * G, b1 * G

    def rows(x: Tensor | None) -> Tensor | None:
        return None if x is None else x[r0:r1]

    return Rollout(group_size=G, old_logp=rows(rollout.old_logp), ref_logp=rows(rollout.ref_logp),
                   action_mask=rollout.action_mask[r0:r1], rewards=rollout.rewards[b0:b1],
                   is_truncated=rollout.is_truncated[r0:r1], max_action_length=rollout.max_action_length,
                   replay=slice_rows(rollout.replay, r0, r1), loop=rollout.loop, advantages=rows(rollout.advantages),
                   reward_stats=rollout.reward_stats)


def build_composer(rewards, config: GRPOConfig, loop_key: str) -> RewardComposer:
    """A loop's ``RewardComposer`` from a composer, a list of rewards / reward configs, or None (the default);
    ``config.reward_weights`` (name -> weight) overrides the weights of rewards with those names."""
    composer = rewards if isinstance(rewards, RewardComposer) else RewardComposer(
        DEFAULT_REWARDS[loop_key] if rewards is None else list(rewards))
    for reward in composer.rewards:
        if config.reward_weights and reward.name in config.reward_weights:
            reward.weight = float(config.reward_weights[reward.name])
    if all(r.weight == 0 for r in composer.rewards):
        raise ValueError(f"CycleGRPO: every {loop_key} reward has weight 0 after reward_weights="
                         f"{config.reward_weights}; give at least one of {[r.name for r in composer.rewards]} a "
                         f"non-zero weight, or set {loop_key}_weight=0 to switch the loop off.")
    return composer


def _scoring_lm(model: nn.Module) -> nn.Module | None:
    """The LM that every grouped scoring pass runs: Qwen-VL's ``hf_model``, Sa2VA's ``language_model``."""
    scoring_lm = getattr(model, "hf_model", None)
    return getattr(model, "language_model", None) if scoring_lm is None else scoring_lm


def _configure_scoring_lm(model: nn.Module, config: GRPOConfig) -> None:
    """``GRPOConfig.compile_loss_layers`` and ``uncheckpointed_layers`` on the scoring LM, set either way so a model
    reused by a new trainer follows that trainer's config."""
    scoring_lm = _scoring_lm(model)
    if scoring_lm is not None:
        compile_group_layers(scoring_lm, "inductor" if config.compile_loss_layers else None)
        keep_last_layers_activations(scoring_lm, config.uncheckpointed_layers)


class CycleGRPO:
    """Dual-loop GRPO on one Sa2VA backbone (policy, EMA partner and reference share it through ``weights``).

    Args:
        model: the unwrapped ``Sa2VAModel`` (LoRA applied, trainable set configured).
        processor: its ``Sa2VAProcessor``.
        weights: ``WeightSets`` over the model's trainable tensors (``use_reference=True`` when ``beta > 0``).
        rewards: per loop (``mask_to_caption`` / ``caption_to_mask``) a ``RewardComposer`` or a list of rewards /
            reward configs; a missing key takes ``DEFAULT_REWARDS`` (on video steps ``DEFAULT_VIDEO_REWARDS`` where
            it has the loop). A loop-2 list with a mask reward (e.g.
            ``[dict(type='iou')]``: sampled mask vs gt_mask) is the supervised ablation.
        config: ``GRPOConfig`` or its dict.
        minibatch_size: rollouts of each loop per ``train_step`` (a multiple of ``num_generations``); None puts
            all B * G rollouts of the step in one minibatch.
        seg_answer: loop 2's teacher-forced answer; must hold exactly one ``[SEG]`` (default: an SFT answer).
        seg_answer_max_tokens: greedy budget of the partner's RES answer in loop 1.
        use_partner_captions: False skips the partner's description in loop 2 (``pred_captions`` is then None, so
            only mask rewards can score loop 2).
        seed: seeds one ``torch.Generator`` on the model's device for every sampling draw; None uses torch's
            global RNG (seeded by the runner).
        disable_dropout: set every dropout probability of the model to 0 (module docstring); False keeps dropout
            in the loss pass only (rollouts run in eval mode), so ratios start off 1 by the dropout noise.
        cross_rank_sum: element-wise sum of a float64 tensor over the data-parallel ranks (the engine passes
            ``engine.stats.sum_across_ranks``); None: a single process.
    """

    def __init__(self, model, processor, weights, rewards: Mapping[str, Any] | None = None,
                 config: GRPOConfig | Mapping[str, Any] | None = None, *, minibatch_size: int | None = None,
                 seg_answer: str = SEG_ANSWER, seg_answer_max_tokens: int = 16,
                 use_partner_captions: bool = True, seed: int | None = None, disable_dropout: bool = True,
                 cross_rank_sum: Callable[[Tensor], Tensor] | None = None):
        config = config if isinstance(config, GRPOConfig) else GRPOConfig(**dict(config or {}))
        G = config.num_generations
        if minibatch_size is not None and (minibatch_size <= 0 or minibatch_size % G):
            raise ValueError(f"CycleGRPO: minibatch_size={minibatch_size} is not a positive multiple of "
                             f"num_generations={G}; a group's G rollouts share one baseline, so use a multiple of "
                             f"{G} or None.")
        if seg_answer_max_tokens < 2:
            raise ValueError(f"CycleGRPO: seg_answer_max_tokens={seg_answer_max_tokens}; the partner needs at least "
                             "2 tokens ('[SEG]' plus the token that feeds it back), e.g. 16.")
        unknown = sorted(set(rewards or {}) - {loop.name for loop in CYCLE_LOOPS})
        if unknown:
            raise ValueError(f"CycleGRPO: rewards has keys {unknown}; expected 'mask_to_caption' and/or "
                             "'caption_to_mask'.")
        if model.seg_token_id is None:
            model.bind_tokenizer(processor.tokenizer)
        self.num_dropouts_disabled = zero_dropout(model) if disable_dropout else 0
        self.model, self.processor, self.weights, self.config = model, processor, weights, config
        self.minibatch_size = minibatch_size
        self.cross_rank_sum = cross_rank_sum or _single_process_sum
        answer_ids, seg_position = seg_answer_ids(processor.tokenizer, seg_answer, model.seg_token_id,
                                                  where="CycleGRPO: seg_answer")
        generator = None
        if seed is not None:
            generator = torch.Generator(device=model.device)
            generator.manual_seed(int(seed))
        processor.prompt_length_multiple = config.prompt_length_multiple  # every tokenize_prompts of the step
        _configure_scoring_lm(model, config)
        self.context = CycleContext(
            model=model, processor=processor, weights=weights, config=config, mask_policy=build_mask_policy(config),
            decoding=TextDecoding.from_processor(processor, config.decode_backend, config.completion_length_multiple),
            seg_answer_ids=answer_ids,
            seg_answer_index=seg_position, seg_answer_max_tokens=int(seg_answer_max_tokens),
            use_partner_captions=bool(use_partner_captions), generator=generator)
        self.loops = []
        for loop_cls in CYCLE_LOOPS:
            if loop_cls is CaptionToMaskLoop and config.mask_policy == DETERMINISTIC_MASK:
                loop_cls = AnswerToMaskLoop  # the same loop with the answer text as its action
            weight = float(getattr(config, f"{loop_cls.name}_weight"))
            if weight > 0:
                given = (rewards or {}).get(loop_cls.name)
                loop = loop_cls(self.context, build_composer(given, config, loop_cls.name), weight)
                video_default = DEFAULT_VIDEO_REWARDS.get(loop_cls.name) if given is None else None
                loop.video_composer = loop.composer if video_default is None else build_composer(
                    video_default, config, loop_cls.name)
                self.loops.append(loop)
        names = {r.name for loop in self.loops for c in (loop.composer, loop.video_composer) for r in c.rewards}
        unused = sorted(set(config.reward_weights or {}) - names)
        if unused:
            raise ValueError(f"CycleGRPO: reward_weights names {unused}, which no active loop's reward has (they have "
                             f"{sorted(names)}); fix the names or drop them.")

    # ---- the step ------------------------------------------------------------------------------------------

    def encode(self, batch: Sequence) -> StepFeatures:
        """Frozen ViT and SAM2 features of the batch, once per distinct image or clip (``grpo.features``)."""
        keys = {loop.name for loop in self.loops}
        return encode_step(self.model, self.processor, batch, use_region_cells="mask_to_caption" in keys,
                           use_prompt_texts="caption_to_mask" in keys, mllm_frames=self.config.video_mllm_frames)

    def _split_by_loop(self, features: StepFeatures) -> dict[str, StepFeatures]:
        """Each loop's share of ``features``: the samples that carry what it needs (all of them with paired data;
        a video step's loop 1 sees their key frames, ``grpo.features.loop_features``)."""
        return {loop.name: loop_features(features, loop.name) for loop in self.loops}

    def _num_chunks(self, features: StepFeatures) -> int:
        return len(group_chunks(features.num_samples, self.config.num_generations, self.minibatch_size))

    def rollout(self, features: StepFeatures) -> SampledStep[StepFeatures]:
        """One rollout per active loop (loop 1 first), no grad; rewards stay NaN until ``score``. Each loop runs on
        the samples that carry what it needs (``loop_rows``: all of them with paired data)."""
        check_compute_dtype(self.model, "CycleGRPO.rollout")
        loop_features = self._split_by_loop(features)
        needs_old_logp = self.config.num_iterations > 1 or any(
            self._num_chunks(f) > 1 for f in loop_features.values())
        joins = self._joins_loops(features, loop_features)
        rescores = needs_old_logp and (joins or self._scores_old_logp_with_the_loss_graph())
        outs = [loop.rollout(loop_features[loop.name], needs_old_logp=needs_old_logp and not rescores,
                             needs_ref_logp=not joins) for loop in self.loops]
        rollouts = tuple(out.rollout for out in outs)
        if joins:
            rollouts = self._with_caption_prefix(rollouts)
            if self.config.beta > 0:
                rollouts = self.joint_reference(loop_features[MaskToCaptionLoop.name], rollouts)
        if rescores:
            rollouts = self._old_logp_from_the_loss_graph(features, rollouts)
        return SampledStep(features=features, rollouts=rollouts, reward_inputs=tuple(out.reward_inputs for out in outs),
                           rollout_stats=tuple(out.stats for out in outs))

    def _joins_loops(self, features: StepFeatures, shares: dict[str, StepFeatures]) -> bool:
        """True when one pass scores both loops (``GRPOConfig.joint_loop_scoring``, ``cycle.joint_action_logps``): loop
        1 and the stochastic-mask loop 2 are both on, over the same image samples of an InternVL-family Sa2VA whose
        LM the grouped passes support."""
        names = {type(loop) for loop in self.loops}
        if not self.config.joint_loop_scoring or names != {MaskToCaptionLoop, CaptionToMaskLoop}:
            return False
        if features.video is not None or features.drawn_regions is not None or is_qwen_vl_model(self.model):
            return False
        captions, masks = shares[MaskToCaptionLoop.name], shares[CaptionToMaskLoop.name]
        # any sliding window in use refuses: the prompt lengths are not known before the rollout
        return captions.sample_ids == masks.sample_ids and supports_grouping(self.model.language_model, sys.maxsize)

    def _with_caption_prefix(self, rollouts: tuple[Rollout, ...]) -> tuple[Rollout, ...]:
        """The rollouts with loop 2's ``MaskReplay.caption_prefix`` set against loop 1's region prompts."""
        captions, masks = self._caption_and_mask_rollouts(rollouts)
        G = self.config.num_generations
        regions, grounding = captions.replay, masks.replay
        L1, L2 = regions.prompt_ids.shape[1], grounding.prompt_ids.shape[1]
        prompts = torch.cat([t[::G].long() for t in (regions.prompt_ids, regions.prompt_attention, grounding.prompt_ids,
                                                      grounding.prompt_attention)], 1).cpu()  # one read
        lengths = caption_prefix_lengths(*prompts.split([L1, L1, L2, L2], 1))  # [B, 2]
        masks = replace(masks, replay=replace(grounding, caption_prefix=lengths.repeat_interleave(G, 0)))
        return tuple(masks if r.loop == masks.loop else r for r in rollouts)

    @staticmethod
    def _caption_and_mask_rollouts(rollouts: Sequence[Rollout]) -> tuple[Rollout, Rollout]:
        """Loop 1's and loop 2's rollouts of a step that runs both."""
        by_loop = {r.loop: r for r in rollouts}
        return by_loop[MaskToCaptionLoop.name], by_loop[CaptionToMaskLoop.name]

    def _joint_logps(self, model, features: StepFeatures, tile_embeds: Tensor, captions: Rollout, masks: Rollout,
                     samples: Sequence[int]) -> dict[str, Tensor]:
        """``{loop name: action log-probs}`` of both loops' groups ``samples`` from one pass."""
        caption_logp, mask_logp = joint_action_logps(self.context, model, features, tile_embeds, captions, masks,
                                                     samples)
        return {MaskToCaptionLoop.name: caption_logp, CaptionToMaskLoop.name: mask_logp}

    def _joint_logps_in_chunks(self, model, features: StepFeatures, tile_embeds: Tensor, rollouts: Sequence[Rollout],
                               chunk_size: int | None) -> dict[str, Tensor]:
        """``{loop name: detached action log-probs [N, T]}`` of both loops, one joint pass per chunk of groups."""
        captions, masks = self._caption_and_mask_rollouts(rollouts)
        parts: dict[str, list[Tensor]] = {captions.loop: [], masks.loop: []}
        for b0, b1 in group_chunks(features.num_samples, self.config.num_generations, chunk_size):
            logps = self._joint_logps(model, features, tile_embeds, slice_groups(captions, b0, b1),
                                      slice_groups(masks, b0, b1), range(b0, b1))
            for name, logp in logps.items():
                parts[name].append(logp.detach())
        return {name: torch.cat(chunks) for name, chunks in parts.items()}

    @torch.no_grad()
    def joint_reference(self, features: StepFeatures, rollouts: tuple[Rollout, ...]) -> tuple[Rollout, ...]:
        """Copies of ``rollouts`` with ``ref_logp`` of both loops scored together under the reference weights, in
        chunks of ``generation_chunk_size`` groups (the loops' own reference passes are skipped); ``features``: the
        loops' (common) share of the step."""
        model = self.model
        with eval_mode(model), self.weights.reference(model):
            tile_embeds = model.project_vision(features.vit_tokens)
            ref_logp = self._joint_logps_in_chunks(model, features, tile_embeds, rollouts,
                                                   self.config.generation_chunk_size)
        return tuple(replace(r, ref_logp=ref_logp[r.loop]) for r in rollouts)

    def _joint_parts(self, parts: Sequence[LoopBatch]) -> tuple[LoopBatch, LoopBatch] | None:
        """The (loop 1, loop 2) parts of a minibatch when one pass scores them (:meth:`_joins_loops` held at rollout
        time and both cover the same groups), else None."""
        by_type = {type(part.loop): part for part in parts}
        captions, masks = by_type.get(MaskToCaptionLoop), by_type.get(CaptionToMaskLoop)
        if len(parts) != 2 or captions is None or masks is None or masks.rollout.replay.caption_prefix is None:
            return None
        return (captions, masks) if captions.samples == masks.samples else None

    def _scores_old_logp_with_the_loss_graph(self) -> bool:
        """True when ``old_logp`` comes from :meth:`_old_logp_from_the_loss_graph`: the scoring LM's layers are compiled
        and no dropout is active (with dropout the loss scores a perturbed policy and no ``old_logp`` equals it, so
        the sampling pass's own, eval-mode values stay)."""
        scoring_lm = _scoring_lm(self.model)
        return scoring_lm is not None and uses_compiled_layers(scoring_lm) and not any(
            isinstance(module, DROPOUT_TYPES) and module.p > 0 for module in self.model.modules())

    def _old_logp_from_the_loss_graph(self, features: StepFeatures, rollouts: tuple[Rollout, ...]
                                      ) -> tuple[Rollout, ...]:
        """Copies of ``rollouts`` whose ``old_logp`` the loss pass's own code scored: each loop's ``action_logp`` on
        the minibatch chunks, in the model's own mode (the loss pass's: the engine sets train mode before the step and
        nothing changes it until the update) with grad on, then detached.

        Why: a compiled decoder layer runs one graph per grad mode and train/eval mode, and the sampling pass's graph
        (no grad, eval) is not the loss pass's (grad, train, checkpointed); Inductor fuses each on its own, so their
        float rounding may differ and the first ratio would not be exactly 1. Here the very graph the loss pass runs
        computes both. Memory: a chunk's forward holds what the loss pass's forward holds (with checkpointing, each
        layer's input) until its result is detached; nothing keeps the graph.
        """
        model, G = self.model, self.config.num_generations
        shares = self._split_by_loop(features)
        rescored = []
        with torch.enable_grad():
            tile_embeds = model.project_vision(features.vit_tokens)  # as policy_loss: with grad through mlp1
            if any(getattr(r.replay, "caption_prefix", None) is not None for r in rollouts):  # one pass, as the loss
                old_logp = self._joint_logps_in_chunks(model, shares[MaskToCaptionLoop.name], tile_embeds, rollouts,
                                                       self.minibatch_size)
                return tuple(replace(r, old_logp=old_logp[r.loop]) for r in rollouts)
            for rollout in rollouts:
                loop, share = self._loop_of(rollout), shares[rollout.loop]
                chunks = group_chunks(share.num_samples, G, self.minibatch_size)
                old_logp = torch.cat([loop.action_logp(model, share, tile_embeds, slice_groups(rollout, b0, b1),
                                                       range(b0, b1)).detach() for b0, b1 in chunks])  # [N, T]
                rescored.append(replace(rollout, old_logp=old_logp))
        return tuple(rescored)

    def score(self, sampled: SampledStep[StepFeatures]) -> ScoredStep[StepFeatures]:
        """Copies of the rollouts with ``rewards [B, G]`` (NaN where no reward applies) and ``reward_stats`` set."""
        rollouts = []
        is_video = sampled.features.video is not None
        for rollout, inputs, stats in zip(sampled.rollouts, sampled.reward_inputs, sampled.rollout_stats):
            loop = self._loop_of(rollout)
            total, reward_stats = (loop.video_composer if is_video else loop.composer).compute(inputs)  # [N]
            rewards = total.reshape(rollout.rewards.shape).to(rollout.rewards.dtype)  # [B, G]
            rollouts.append(rollout.with_rewards(rewards, {**reward_stats, **stats}))
        return ScoredStep(features=sampled.features, rollouts=tuple(rollouts))

    def compute_advantages(self, scored: ScoredStep[StepFeatures]) -> AdvantagedStep[StepFeatures]:
        """Copies of the rollouts with group advantages (``config.scale_rewards``), on the loss device."""
        rollouts = []
        for rollout in scored.rollouts:
            batch_std = std_from_moments(self.cross_rank_sum(reward_moments(rollout.rewards)))  # global batch
            advantages, _ = group_advantages(rollout.rewards, self.config.scale_rewards, batch_std=batch_std)  # [N]
            rollouts.append(rollout.with_advantages(advantages.to(rollout.action_mask.device)))
        return AdvantagedStep(features=scored.features, rollouts=tuple(rollouts))

    def _loop_of(self, rollout: Rollout):
        for loop in self.loops:
            if rollout.loop == loop.name:
                return loop
        raise ValueError(f"CycleGRPO: no active loop is named {rollout.loop!r} (active: "
                         f"{[loop.name for loop in self.loops]}); pass the rollouts rollout() returned.")

    def minibatches(self, advantaged: AdvantagedStep[StepFeatures]) -> Iterator[PolicyMinibatch]:
        """``num_iterations`` passes over the prompt chunks; each minibatch holds that chunk of every loop."""
        rollouts, features = advantaged.rollouts, advantaged.features
        loop_features = self._split_by_loop(features)
        active = torch.stack([self._active_tokens(r) for r in rollouts])  # [R] on the device: one host read below
        local = torch.stack([active, torch.ones_like(active)], dim=1)  # [R, 2]
        counts = self.cross_rank_sum(local).tolist()  # per loop: [global active elements, world size]
        loops = []
        for rollout, (total, world) in zip(rollouts, counts):
            loop = self._loop_of(rollout)
            share = loop_features[loop.name]
            chunks = group_chunks(share.num_samples, self.config.num_generations, self.minibatch_size)
            loops.append((loop, rollout, total / world / len(chunks), share, chunks))
        for iteration in range(self.config.num_iterations):
            # chunk k of every loop in minibatch k (loops with fewer prompts have fewer chunks)
            for k in range(max(len(chunks) for *_, chunks in loops)):
                parts = [LoopBatch(loop, slice_groups(r, *chunks[k]), range(*chunks[k]), n, share)
                         for loop, r, n, share, chunks in loops if k < len(chunks)]
                yield PolicyMinibatch(features=features, parts=parts, iteration=iteration)

    def _active_tokens(self, rollout: Rollout) -> Tensor:
        """0-dim float64 count of the rollout's active action elements, left on its device."""
        is_active = rollout.action_mask
        if self.config.mask_truncated_completions:
            is_active = is_active & ~rollout.is_truncated[:, None]  # [N, T]
        return is_active.sum(dtype=torch.float64)

    def policy_loss(self, model, minibatch: PolicyMinibatch) -> dict[str, Tensor]:
        """``{'loss': sum_loop weight * L_loop, '<loop>/<stat>': ...}``; log-probs recomputed with grad.

        ``mlp1`` re-projects the cached ViT tokens once for both loops; stats are ``PolicyLoss``'s (no key contains
        'loss', so MMEngine's ``parse_losses`` sums only the loss).
        """
        features = minibatch.features
        total, stats = None, {}
        tile_embeds = model.project_vision(features.vit_tokens)  # [n_tiles, t, D], with grad through mlp1
        joint, logps = self._joint_parts(minibatch.parts), {}
        if joint is not None:  # both loops' action log-probs from one pass over the image prefixes
            captions, masks = joint
            logps = self._joint_logps(model, captions.features or features, tile_embeds, captions.rollout,
                                      masks.rollout, captions.samples)
        for part in minibatch.parts:  # the loop's policy gradient (+ its dense mask loss when configured)
            scored = {"logp": logps[part.loop.name]} if part.loop.name in logps else {}
            loss, loop_stats = part.loop.loss_terms(model, part.features or features, tile_embeds, part.rollout,
                                                    part.samples, part.num_active_tokens, **scored)
            total = part.loop.weight * loss if total is None else total + part.loop.weight * loss
            stats.update({f"{part.loop.name}/{key}": value for key, value in loop_stats.items()})
        return {"loss": total, **stats}

    def after_optimizer_step(self) -> None:
        """Nothing: the EMA partner update is the ``EMAPartnerHook``'s (timing lives in hooks)."""
