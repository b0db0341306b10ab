"""Dense mask objectives beside the policy gradient: a Dice + BCE loss on the policy's own ``[SEG]`` mask logits.

Systems with a ``[SEG]``-embedding → mask-decoder head train the decoder with a differentiable mask loss computed
from their rollouts rather than by sampling mask cells. Two such objectives, one per cycle loop, each an option of
``GRPOConfig`` (weight 0 = off):

* Loop 1 (``mask_to_caption_dense_weight``): the policy segments its own sampled caption c_i (the RES prompt with
  the teacher-forced answer ``Sure, [SEG].``) and its mask logits z_i are pulled toward the input region R:

      L_dense1 = sum_i w_i ell(z_i, R) / sum_i w_i,      w_i = DENSE_ROLLOUT_WEIGHTS[rule](A)_i

  The region is the data's and the caption the policy's: no caption label is used. The weights pick the captions
  that earned it: ``positive`` (w = 1[A > 0]), ``advantage`` (w = max(A, 0)) or ``best`` (the group's highest
  advantage, if > 0). A caption with A <= 0 never gets the loss: pulling its mask toward the region would teach
  the model to ground a wrong description onto it.
* Loop 2 (``caption_to_mask_dense_weight``, with ``mask_policy='deterministic'``): every rollout's deterministic
  mask logits z_i (its sampled answer's ``[SEG]``) are pulled toward the binary mask M_b* of its group's best-scored
  member, b* = argmax_g r_bg (the mask whose partner description scored best):

      L_dense2 = mean over rollouts i with a [SEG] in groups with reward spread of ell(z_i, M_{b*(i)})

  A group whose rewards are all equal names no best member and gets no loss.

ell is upstream Sa2VA's SFT mask loss per mask (``model.sft.sft_loss.mask_loss_per_mask``: 2.0 · BCE + 0.5 · Dice at
PointRend points of the low-res logits); targets are at the low-res logits size (``resize_gt_masks``).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def _positive(advantages: Tensor, group_size: int) -> Tensor:
    return (advantages > 0).float()


def _advantage(advantages: Tensor, group_size: int) -> Tensor:
    return advantages.float().clamp(min=0.0)


def _best(advantages: Tensor, group_size: int) -> Tensor:
    groups = advantages.float().reshape(-1, group_size)  # [B, G]
    is_best = torch.zeros_like(groups)
    is_best[torch.arange(groups.shape[0], device=groups.device), groups.argmax(-1)] = 1.0
    return (is_best * (groups > 0)).reshape(-1)  # [N]


# rule -> (advantages [N], G) -> non-negative rollout weights [N]
DENSE_ROLLOUT_WEIGHTS: dict[str, Callable[[Tensor, int], Tensor]] = {
    "positive": _positive,
    "advantage": _advantage,
    "best": _best,
}


def dense_rollout_weights(advantages: Tensor, group_size: int, rule: str) -> Tensor:
    """Loop 1's weights ``[N]`` (>= 0, fp32) of the rollouts' dense losses under ``rule`` (module docstring)."""
    if rule not in DENSE_ROLLOUT_WEIGHTS:
        raise ValueError(f"dense_rollout_weights: rule={rule!r} is not one of {sorted(DENSE_ROLLOUT_WEIGHTS)}.")
    return DENSE_ROLLOUT_WEIGHTS[rule](advantages.detach(), group_size)


def best_in_group(rewards: Tensor) -> tuple[Tensor, Tensor]:
    """``(best [B] long, has_spread [B] bool)`` of group rewards ``[B, G]`` (NaN = unscored, never the best):
    the index of each group's highest reward, and whether the group's scored rewards differ at all (a group
    without spread has no best member)."""
    scored = torch.nan_to_num(rewards.float(), nan=float("-inf"))  # [B, G]
    low = torch.nan_to_num(rewards.float(), nan=float("inf")).min(-1).values  # [B]
    high = scored.max(-1)
    return high.indices, torch.isfinite(high.values) & (high.values > low)


def weighted_mean(values: Tensor, weights: Tensor) -> Tensor:
    """sum(w v) / sum(w), 0 (with grad) when every weight is 0."""
    return (weights * values).sum() / weights.sum().clamp(min=1e-8)
