"""The rollout hand-off: one ``Rollout`` dataclass produced by both loops and consumed by the loss.

Loop 1 (mask -> caption -> mask') acts with caption tokens; loop 2 (caption -> mask -> caption') acts with a
stochastic mask. Both describe their action as ``T`` log-probability elements per rollout (tokens, or mask
elements of the mask policy), so the clipped objective in ``losses.py`` never asks which loop ran. What only
a loop needs to re-score its action under new weights (``num_iterations > 1``, reference pass) travels in the
typed ``replay`` slot: ``CaptionReplay``, ``MaskReplay`` or ``AnswerReplay``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor


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
    """

    prompt_ids: Tensor
    prompt_attention: Tensor
    answer_ids: Tensor
    seg_index: Tensor
    image_index: Tensor
    action: Tensor


@dataclass
class Rollout:
    """N = B * G rollouts of one loop, ready for the clipped policy-gradient loss.

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
        advantages: ``[N]`` float, filled by ``with_advantages`` after scoring.
        reward_stats: detached per-term reward statistics (means, stds, failure counts) for logging.
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

    def with_advantages(self, advantages: Tensor) -> "Rollout":
        """Return this rollout with ``advantages`` [N] set (validated like every other field)."""
        return replace(self, advantages=advantages.detach())
