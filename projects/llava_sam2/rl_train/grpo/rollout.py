"""The hand-offs between the algorithm's stages: one ``Rollout`` dataclass produced by both loops and consumed by the
loss, and the three step values that carry it from stage to stage.

Each stage of a ``grpo.protocol.GRPOAlgorithm`` returns a new value that the next stage consumes, and leaves its input
as it was (TRL hands one returned structure to its loss the same way)::

    features = encode(batch)
    sampled = rollout(features)              # SampledStep: rollouts with NaN rewards, plus what scoring needs
    scored = score(sampled)                  # ScoredStep: rewards [B, G] and reward_stats set
    advantaged = compute_advantages(scored)  # AdvantagedStep: advantages [N] set
    for minibatch in minibatches(advantaged): ...

Every step value carries the step's ``features``, so a later stage never reads features parked on the algorithm, and
a step can be scored or trained whatever ran in between. ``Rollout`` is frozen: a stage that changes a rollout returns
a copy (``with_rewards``, ``with_advantages``).

Loop 1 (mask -> caption -> mask') acts with caption tokens; loop 2 (caption -> mask -> caption') acts with a
stochastic mask. Both describe their action as ``T`` log-probability elements per rollout (tokens, or mask
elements of the mask policy), so the clipped objective in ``losses.py`` never asks which loop ran. What only
a loop needs to re-score its action under new weights (``num_iterations > 1``, reference pass) travels in the
typed ``replay`` slot: ``CaptionReplay``, ``MaskReplay`` or ``AnswerReplay``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

import torch
from torch import Tensor

from ..rewards.base import RewardInputs

FeaturesT = TypeVar("FeaturesT")  # what an algorithm's encode() returns (CycleGRPO: grpo.features.StepFeatures)


@dataclass
class CaptionReplay:
    """Loop 1 inputs that re-score sampled caption tokens (teacher forcing under other weights).

    Attributes:
        prompt_ids: ``[N, L]`` long, left-padded templated region prompt, each prompt repeated G times.
        prompt_attention: ``[N, L]`` bool, True on real prompt tokens.
        completion_ids: ``[N, T]`` long, sampled caption tokens (padding past the end is masked by
            ``Rollout.action_mask``).
        image_index: ``[N]`` long, row of the once-per-step image features (ViT tokens, SAM2 embeddings)
            that rollout ``n`` belongs to.
        seg_prompt_ids: ``[N, L']`` long, left-padded RES prompt that asks to segment rollout ``n``'s own caption
            (loop 1's dense mask loss, ``mask_to_caption_dense_weight > 0``); None otherwise.
        seg_prompt_attention: ``[N, L']`` bool, or None.
        has_caption: ``[N]`` bool, False where the sampled caption is empty (nothing to segment), or None.
    """

    prompt_ids: Tensor
    prompt_attention: Tensor
    completion_ids: Tensor
    image_index: Tensor
    seg_prompt_ids: Tensor | None = None
    seg_prompt_attention: Tensor | None = None
    has_caption: Tensor | None = None


@dataclass
class AnswerReplay(CaptionReplay):
    """Loop 2 with ``mask_policy='deterministic'``: the action is the sampled answer text to the RES prompt
    (``prompt_ids`` / ``completion_ids``, as a caption), and the mask is the greedy mask of its first fed-back
    ``[SEG]``.

    Attributes (besides ``CaptionReplay``'s):
        seg_position: ``[N]`` long, index in ``completion_ids`` of the first fed-back ``[SEG]``, -1 where the answer
            has none (no mask).
        seg_mask: ``[N, h, w]`` bool, the low-res mask the rollout produced (SAM2 best logits > 0; all False without
            ``[SEG]``): the self-training target when the rollout is its group's best.
    """

    seg_position: Tensor | None = None
    seg_mask: Tensor | None = None


@dataclass
class MaskReplay:
    """Loop 2 inputs that re-score a sampled mask action.

    Attributes:
        prompt_ids: ``[N, L]`` long, left-padded templated segmentation prompt (the caption to ground).
        prompt_attention: ``[N, L]`` bool.
        answer_ids: ``[N, A]`` long, teacher-forced answer that holds the ``[SEG]`` token.
        seg_index: ``[N]`` long, position of ``[SEG]`` in ``answer_ids`` (its hidden state -> seg prompt).
        image_index: ``[N]`` long, row of the once-per-step image features.
        action: the mask policy's sampled action for ``MaskPolicy.log_prob`` (shape set by the policy:
            ``[N, g, g]`` bool region cells for ``region``, ``[N, h', w']`` bool for ``bernoulli``, ``[N, 256]``
            fp32 for ``gaussian_seg``, ``[N]`` long for ``multimask``).
        grounding_index: ``[N]`` long, the SAM2 row the mask is decoded on when it is not ``image_index``: a video
            step's key frame (a frame row of the clips' features, chosen at rollout time); None for an image step.
        caption_prefix: ``[N, 2]`` long on the host, (P, S) per row: the first P real tokens of its prompt equal
            those of loop 1's region prompt of the same sample (template header and image block), S real tokens
            follow. Set by ``CycleGRPO`` when both loops run on the same image samples, so that one pass scores both
            loops over one image prefix (``cycle.joint_action_logps``); None: the loop is scored alone.
    """

    prompt_ids: Tensor
    prompt_attention: Tensor
    answer_ids: Tensor
    seg_index: Tensor
    image_index: Tensor
    action: Tensor
    grounding_index: Tensor | None = None
    caption_prefix: Tensor | None = None


@dataclass(frozen=True)
class Rollout:
    """N = B * G rollouts of one loop, ready for the clipped policy-gradient loss (frozen: stages return copies).

    Rollout ``n = b * G + g`` is generation ``g`` of prompt ``b`` (so ``rewards.reshape(-1)[n]`` is its reward).

    Attributes:
        group_size: G, rollouts per prompt (``num_generations``).
        old_logp: ``[N, T]`` float, detached log-probs of the action elements under the sampling policy, or
            None when ``num_iterations == 1``: the loss then uses ``logp.detach()`` (ratio 1 in value, same
            gradient) and skips a forward pass.
        ref_logp: ``[N, T]`` float, detached log-probs under the reference weights, or None when ``beta == 0``.
        action_mask: ``[N, T]`` bool, True on elements that count (completion tokens before padding; every
            element of a mask action).
        rewards: ``[B, G]`` float, combined reward, NaN where unscorable.
        is_truncated: ``[N]`` bool, True where a caption hit ``max_completion_length`` without a stop token
            (always False for mask actions).
        max_action_length: dr_grpo's constant T_max: ``max_completion_length`` for captions, the number of
            action elements for masks.
        replay: loop-specific inputs to re-score the action (``CaptionReplay`` | ``MaskReplay`` | ``AnswerReplay``).
        loop: name of the loop that produced it (``mask_to_caption`` | ``caption_to_mask``): the prefix of its
            metrics (``<loop>/reward_mean``) and rollout logs.
        advantages: ``[N]`` float, set by ``with_advantages`` after scoring.
        reward_stats: detached per-term reward statistics (means, stds, failure counts) for logging, set by
            ``with_rewards``.
    """

    group_size: int
    old_logp: Tensor | None
    ref_logp: Tensor | None
    action_mask: Tensor
    rewards: Tensor
    is_truncated: Tensor
    max_action_length: int
    replay: CaptionReplay | MaskReplay | AnswerReplay
    loop: str
    advantages: Tensor | None = None
    reward_stats: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.loop, str) or not self.loop:
            raise ValueError(f"Rollout: loop={self.loop!r}; give the producing loop's name (e.g. 'mask_to_caption').")
        N, T = self.action_mask.shape
        B, G = self.rewards.shape
        if G != self.group_size or B * G != N:
            raise ValueError(
                f"Rollout: rewards {tuple(self.rewards.shape)} do not match group_size={self.group_size} and "
                f"action_mask {tuple(self.action_mask.shape)}; rewards must be [B, G] with B * G == N."
            )
        if self.action_mask.dtype != torch.bool or self.is_truncated.dtype != torch.bool:
            raise TypeError(
                f"Rollout: action_mask ({self.action_mask.dtype}) and is_truncated ({self.is_truncated.dtype}) "
                "must be torch.bool; convert with `.bool()`."
            )
        expected = {"old_logp": (N, T), "ref_logp": (N, T), "is_truncated": (N,), "advantages": (N,)}
        for name, shape in expected.items():
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise ValueError(f"Rollout: {name} has shape {tuple(value.shape)}, expected {shape} (N={N}, T={T}).")
        if self.max_action_length < T:
            raise ValueError(
                f"Rollout: max_action_length={self.max_action_length} is below the action length T={T}; "
                "pass max_completion_length for captions or the policy's element count for masks."
            )

    @property
    def num_prompts(self) -> int:
        """B."""
        return self.rewards.shape[0]

    @property
    def num_rollouts(self) -> int:
        """N = B * G."""
        return self.action_mask.shape[0]

    def with_rewards(self, rewards: Tensor, reward_stats: Mapping[str, float]) -> "Rollout":
        """A copy of this rollout with ``rewards`` [B, G] and ``reward_stats`` set (validated like every other
        field)."""
        return replace(self, rewards=rewards, reward_stats=dict(reward_stats))

    def with_advantages(self, advantages: Tensor) -> "Rollout":
        """A copy of this rollout with ``advantages`` [N] set (validated like every other field)."""
        return replace(self, advantages=advantages.detach())


def _check_rollouts(where: str, rollouts) -> None:
    if not isinstance(rollouts, tuple) or not all(isinstance(r, Rollout) for r in rollouts):
        raise TypeError(f"{where}: rollouts must be a tuple of Rollout (one per active loop), got {rollouts!r:.200}; "
                        "pass tuple(rollouts).")


@dataclass(frozen=True)
class SampledStep(Generic[FeaturesT]):
    """What ``rollout`` hands to ``score``.

    Attributes:
        features: the step's ``encode`` output, passed on to the loss.
        rollouts: one ``Rollout`` per active loop, ``rewards`` still NaN.
        reward_inputs: per rollout, the N-row inputs of its rewards (the loop's predictions and the step's targets).
        rollout_stats: per rollout, statistics of the rollout pass (partner counts, mask area, ...), which ``score``
            adds to the rollout's ``reward_stats``.
    """

    features: FeaturesT
    rollouts: tuple[Rollout, ...]
    reward_inputs: tuple[RewardInputs, ...]
    rollout_stats: tuple[Mapping[str, float], ...]

    def __post_init__(self) -> None:
        _check_rollouts("SampledStep", self.rollouts)
        if not len(self.rollouts) == len(self.reward_inputs) == len(self.rollout_stats):
            raise ValueError(f"SampledStep: {len(self.rollouts)} rollouts, {len(self.reward_inputs)} reward inputs and "
                             f"{len(self.rollout_stats)} rollout stats; give one of each per rollout.")


@dataclass(frozen=True)
class ScoredStep(Generic[FeaturesT]):
    """What ``score`` hands to ``compute_advantages``: the step's ``features`` and one ``Rollout`` per active loop
    with ``rewards`` [B, G] (NaN where no reward applies) and ``reward_stats`` set."""

    features: FeaturesT
    rollouts: tuple[Rollout, ...]

    def __post_init__(self) -> None:
        _check_rollouts("ScoredStep", self.rollouts)


@dataclass(frozen=True)
class AdvantagedStep(Generic[FeaturesT]):
    """What ``compute_advantages`` hands to ``minibatches``: the step's ``features`` and one ``Rollout`` per active
    loop with ``advantages`` [N] set, ready for the loss."""

    features: FeaturesT
    rollouts: tuple[Rollout, ...]

    def __post_init__(self) -> None:
        _check_rollouts("AdvantagedStep", self.rollouts)
        missing = [r.loop for r in self.rollouts if r.advantages is None]
        if missing:
            raise ValueError(f"AdvantagedStep: the {missing} rollouts have no advantages; set them with "
                             "rollout.with_advantages(...) first.")
