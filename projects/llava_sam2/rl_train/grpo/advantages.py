"""Group-normalised advantages (GRPO), None-aware.

Rewards arrive as ``[B, G]``: B prompts, G rollouts each, NaN where no reward applied (a reward source
returned None for every term). Rollout ``n = b * G + g`` is row ``b``, column ``g``, so ``rewards.reshape(-1)``
lines up with every ``[N, ...]`` tensor of the rollout.

    A[b, g] = (r[b, g] - mean_g r[b, :]) / (s + eps)

with ``s`` chosen by ``scale_rewards`` (TRL's vocabulary and semantics, ``GRPOConfig.scale_rewards``):

* ``group``: s = std of the group (DeepSeekMath GRPO, arXiv 2402.03300, eq. in section 4.1.2);
* ``batch``: s = std of the whole batch while the baseline stays the group mean ("Lite PPO",
  arXiv 2508.08221);
* ``none``:  no division (Dr. GRPO, arXiv 2503.20783: the std divisor biases towards too easy / too hard
  prompts).

Means and stds skip NaN (std with Bessel's correction, as ``torch.std``); a NaN reward gets advantage 0,
so an unscorable rollout neither moves the baseline nor the policy. A reward of +-inf is treated as NaN
(unscored) rather than poisoning its group's mean. A group whose valid rewards are all equal has no
learning signal: its advantages are exactly 0. Equality is checked on the values (max == min), not on the
float32 std: rounding in the group mean leaves ``[0.3] * 6`` a std of ~3e-8, which TRL's ``std + 1e-4``
divisor would turn into advantages of ~3e-4 (TRL itself returns those). Rewards that really differ keep their
advantages, however small the spread: ``[0.3, 0.3 + 1e-6]`` gives about +-5e-3 under ``group``.

Under data parallelism the "batch" of ``scale_rewards='batch'`` is the global batch (TRL gathers the rewards
of every process before normalising): the caller sums :func:`reward_moments` over ranks and passes
``batch_std=std_from_moments(summed)``; groups never span ranks, so ``group`` and ``none`` need nothing global.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

# TRL's constant: added to the std so a near-constant group does not blow up.
ADVANTAGE_EPS = 1e-4


def _nan_std(x: Tensor, dim: int | None = None) -> Tensor:
    """Unbiased std of the non-NaN entries; 0 where fewer than two entries are valid (no spread)."""
    if dim is None:
        x, dim = x.reshape(-1), 0
    is_valid = ~torch.isnan(x)
    count = is_valid.sum(dim)
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    sq_dev = torch.where(is_valid, (x - mean) ** 2, torch.zeros_like(x))
    var = sq_dev.sum(dim) / (count - 1).clamp(min=1)
    return torch.where(count > 1, var.sqrt(), torch.zeros_like(var))


def reward_moments(rewards: Tensor) -> Tensor:
    """``[3]`` float64: count, sum and sum of squares of the finite rewards (sum them over ranks for global stats)."""
    values = rewards.detach().double().reshape(-1)
    values = values[torch.isfinite(values)]  # [n_scored]
    return torch.stack([values.new_tensor(float(values.numel())), values.sum(), (values * values).sum()])


def std_from_moments(moments: Tensor) -> Tensor:
    """Unbiased std from ``reward_moments`` (summed over ranks): sqrt((S2 - S1^2 / n) / (n - 1)); 0 if n < 2."""
    n, s1, s2 = moments.double().unbind()
    var = (s2 - s1 * s1 / n.clamp(min=1.0)).clamp(min=0.0) / (n - 1.0).clamp(min=1.0)
    return torch.where(n > 1, var.sqrt(), torch.zeros_like(var))


def _group_divisor(rewards: Tensor, eps: float, batch_std: Tensor | None) -> Tensor:
    return _nan_std(rewards, dim=1)[:, None] + eps  # [B, 1]


def _batch_divisor(rewards: Tensor, eps: float, batch_std: Tensor | None) -> Tensor:
    std = _nan_std(rewards) if batch_std is None else torch.as_tensor(batch_std).to(rewards)
    return (std + eps).expand(rewards.shape[0], 1)  # [B, 1]


def _no_divisor(rewards: Tensor, eps: float, batch_std: Tensor | None) -> Tensor:
    return torch.ones_like(rewards[:, :1])  # [B, 1]


# scale_rewards -> the divisor (s + eps) [B, 1] of the centred rewards.
SCALE_REWARDS = {"group": _group_divisor, "batch": _batch_divisor, "none": _no_divisor}


def rewards_to_tensor(values: Sequence[float | None], group_size: int) -> Tensor:
    """Lay out N = B * G per-rollout rewards (None where no reward applied) as ``[B, G]`` float32, None -> NaN."""
    if group_size < 1 or len(values) % group_size != 0:
        raise ValueError(
            f"rewards_to_tensor: got {len(values)} rewards for group_size={group_size}; the number of rollouts "
            "must be a multiple of num_generations (every prompt has exactly G rollouts)."
        )
    flat = torch.tensor([float("nan") if v is None else float(v) for v in values], dtype=torch.float32)
    return flat.reshape(-1, group_size)  # [B, G]


def group_advantages(
    rewards: Tensor, scale_rewards: str = "group", eps: float = ADVANTAGE_EPS, batch_std: Tensor | None = None
) -> tuple[Tensor, dict[str, float]]:
    """A = (r - nanmean_group(r)) / (s + eps), flattened to ``[N]``; NaN rewards and groups of equal rewards get 0.

    Args:
        rewards: ``[B, G]`` float, NaN where the rollout could not be scored.
        scale_rewards: key of ``SCALE_REWARDS`` (``group`` | ``batch`` | ``none``).
        eps: added to the divisor (TRL uses 1e-4).
        batch_std: std of the whole (global) batch for ``scale_rewards='batch'``; None: of ``rewards``.

    Returns:
        advantages ``[N]`` (N = B * G, row-major so ``n = b * G + g``) and detached stats:
        ``reward_mean``, ``reward_std`` (over valid rollouts), ``frac_reward_zero_std`` (groups whose valid
        rewards have zero spread, i.e. no learning signal), ``frac_unscored`` (NaN rollouts).
        The zero-std fraction counts groups whatever ``scale_rewards`` is (TRL's "batch" mode reports the batch
        std instead); a group with fewer than two valid rewards counts as zero-std.
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(
            f"group_advantages: scale_rewards={scale_rewards!r} is not one of {sorted(SCALE_REWARDS)}; "
            "use 'group' (GRPO), 'batch' (Lite PPO) or 'none' (Dr. GRPO)."
        )
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(
            f"group_advantages: rewards must be [B, G] with G >= 2, got shape {tuple(rewards.shape)}; "
            "reshape the N rewards with rewards_to_tensor(values, num_generations)."
        )
    rewards = rewards.detach().float()
    rewards = torch.where(torch.isfinite(rewards), rewards, torch.full_like(rewards, float("nan")))  # inf -> NaN
    is_scored = ~torch.isnan(rewards)  # [B, G]
    group_mean = torch.nanmean(rewards, dim=1, keepdim=True)  # [B, 1]; NaN if the whole group is unscored
    # a group has no spread when its scored rewards are all equal, tested exactly: the fp32 mean of equal values can
    # be off by an ulp, which made std ~5e-8 and gave a flat group advantages of +-6e-4 (pure rounding noise)
    high = torch.nan_to_num(rewards, nan=float("-inf")).max(dim=1).values  # [B]
    low = torch.nan_to_num(rewards, nan=float("inf")).min(dim=1).values  # [B]
    is_std_zero = (is_scored.sum(dim=1) < 2) | (high == low)  # [B]

    advantages = (rewards - group_mean) / SCALE_REWARDS[scale_rewards](rewards, eps, batch_std)  # [B, G]
    has_signal = is_scored & ~is_std_zero[:, None]  # [B, G]
    advantages = torch.where(has_signal, advantages, torch.zeros_like(advantages))

    num_scored = int(is_scored.sum())
    stats = {
        "reward_mean": float(torch.nanmean(rewards)) if num_scored else float("nan"),
        "reward_std": float(_nan_std(rewards)),
        "frac_reward_zero_std": float(is_std_zero.float().mean()),
        "frac_unscored": 1.0 - num_scored / rewards.numel(),
    }
    return advantages.reshape(-1), stats  # [N]
