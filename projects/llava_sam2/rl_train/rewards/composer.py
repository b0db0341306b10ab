"""Weighted reward composition with fallbacks and per-term statistics.

For rollout n with reward values v_rn (None where missing) and weights w_r, over the rewards with
w_r ≠ 0 (zero-weight rewards are computed and logged only)::

    renormalize (default):  total_n = W · Σ_{r present, w_r>0} w_r v_rn / Σ_{r present, w_r>0} w_r
                                      + Σ_{r present, w_r<0} w_r v_rn,        W = Σ_{w_r>0} w_r
    zero:                   total_n = Σ_{r present} w_r v_rn                 (missing counts as 0)
    nan:                    total_n = NaN if any reward is missing

Weights may be negative, with TRL's semantics (``GRPOTrainer``: total = Σ_r w_r v_r, a negative weight
turns a reward into a penalty); ``zero`` is exactly TRL's ``nansum``. ``renormalize`` scales the present
positive-weight terms by one factor so that their weights add up to the full W (a missing reward is
replaced by the weighted mean of the present ones), and adds the present penalties unscaled: a failed
penalty counts as a penalty of 0 (as TRL's ``nansum`` counts it), so a rollout never scores above the same
rollout whose penalty ran and came out 0. Scaling the penalties' weights into the renormalisation would
instead enlarge the positive terms when a penalty fails (a failure would pay). With no positive-weight reward
present, the positive part cannot be estimated and the total is NaN; with no positive weight at all, the
positive part is 0.

A rollout with no reward present is NaN under every policy; GRPO drops NaN rollouts from the group
statistics (TRL's convention). With the caption weights 0.25 (METEOR) + 0.75 (judge), a failed
judge call thus leaves the METEOR value with weight 1.

Rewards run concurrently: async rewards on one event loop, sync rewards in worker threads.
"""
from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .async_runner import AsyncRunner, default_runner
from .base import Reward, RewardInputs, RewardResult, as_result, build_reward

MISSING_POLICIES = ("renormalize", "zero", "nan")


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def combine(values: torch.Tensor, weights: torch.Tensor, missing: str) -> torch.Tensor:
    """Weighted total per rollout (module doc).

    Args:
        values: ``[R, N]`` float64, NaN where a reward is missing.
        weights: ``[R]`` float64, all ≠ 0 (negative weights penalise).
        missing: one of ``MISSING_POLICIES``.
    Returns:
        ``[N]`` float64 totals, NaN where no value can be formed.
    """
    present = ~torch.isnan(values)  # [R, N]
    weighted = torch.where(present, values * weights[:, None], torch.zeros_like(values))  # [R, N]
    total = weighted.sum(0)  # [N]
    if missing == "renormalize":
        positive_weights = weights.clamp(min=0)  # [R], 0 for penalties
        is_positive = weights > 0  # [R]
        penalties = weighted[~is_positive].sum(0)  # [N], present penalties unscaled, a missing one counts 0
        positive_part = torch.zeros_like(total)  # [N], stays 0 when no reward has a positive weight
        if bool(is_positive.any()):
            present_weight = (present * positive_weights[:, None]).sum(0)  # [N]
            positive_part = positive_weights.sum() * weighted[is_positive].sum(0) / present_weight  # NaN: 0/0
        total = positive_part + penalties
    elif missing == "nan":
        total = torch.where(present.all(0), total, torch.full_like(total, float("nan")))
    return torch.where(present.any(0), total, torch.full_like(total, float("nan")))


class RewardComposer:
    """Gathers rewards concurrently, weights them and reports per-term statistics.

    Args:
        rewards: reward objects or their configs (``dict(type=..., weight=...)``).
        missing: fallback policy for a missing value (``renormalize`` / ``zero`` / ``nan``).
        runner: background loop for :meth:`compute` (default: the process-wide one).
    """

    def __init__(
        self,
        rewards: Sequence[Reward | Mapping[str, Any]],
        missing: str = "renormalize",
        runner: AsyncRunner | None = None,
    ) -> None:
        if missing not in MISSING_POLICIES:
            raise ValueError(f"RewardComposer missing={missing!r}; expected one of {MISSING_POLICIES}")
        self.rewards = [build_reward(r) for r in rewards]
        if not self.rewards:
            raise ValueError("RewardComposer needs at least one reward")
        names = [r.name for r in self.rewards]
        if len(set(names)) != len(names):
            raise ValueError(f"reward names must be unique (they key the logs), got {names}")
        bad = [(r.name, r.weight) for r in self.rewards if not math.isfinite(r.weight)]
        if bad:
            raise ValueError(f"reward weights must be finite numbers, got {bad}")
        if all(r.weight == 0 for r in self.rewards):
            raise ValueError(f"at least one reward needs a non-zero weight, got {[(r.name, r.weight) for r in self.rewards]}")
        self.missing = missing
        self._runner = runner

    def __repr__(self) -> str:
        return f"RewardComposer({self.rewards!r}, missing={self.missing!r})"

    async def _run_one(self, reward: Reward, inputs: RewardInputs) -> tuple[RewardResult, float]:
        start = time.perf_counter()
        if inspect.iscoroutinefunction(reward.__call__) or inspect.iscoroutinefunction(reward):
            output = await reward(inputs)
        else:
            output = await asyncio.to_thread(reward, inputs)
            if inspect.isawaitable(output):
                output = await output
        return as_result(output, len(inputs), reward.name), time.perf_counter() - start

    async def compute_async(self, inputs: RewardInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """``(total [N] float32, stats)``; stats keys are listed in :meth:`_stats`."""
        outputs = await asyncio.gather(*(self._run_one(r, inputs) for r in self.rewards))
        results = [result for result, _ in outputs]
        active = [i for i, r in enumerate(self.rewards) if r.weight != 0]
        values = torch.tensor(
            [[math.nan if v is None else v for v in results[i].values] for i in active], dtype=torch.float64
        ).reshape(len(active), len(inputs))  # [R, N]
        weights = torch.tensor([self.rewards[i].weight for i in active], dtype=torch.float64)  # [R]
        total = combine(values, weights, self.missing)  # [N]
        stats = self._stats(results, [t for _, t in outputs], total, values)
        return total.float(), stats

    def compute(self, inputs: RewardInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """Synchronous :meth:`compute_async` on the background loop."""
        runner = self._runner or default_runner()
        return runner.run(self.compute_async(inputs))

    async def aclose(self) -> None:
        """Release what rewards hold on the loop (the judge's HTTP connections)."""
        for reward in self.rewards:
            if hasattr(reward, "aclose"):
                await reward.aclose()

    def close(self) -> None:
        """Synchronous :meth:`aclose` on the background loop; the composer can still be used after."""
        (self._runner or default_runner()).run(self.aclose())

    def _stats(self, results, times, total: torch.Tensor, values: torch.Tensor) -> dict[str, float]:
        """``<name>/mean|std|missing|time_s``, ``<name>/failures/<cause>``, ``<name>/<stat>``,
        ``total/mean|std``, ``total/fallback`` (finite totals built without every active reward)
        and ``total/invalid`` (NaN totals)."""
        stats: dict[str, float] = {}
        for reward, result, elapsed in zip(self.rewards, results, times):
            present = [v for v in result.values if v is not None]
            stats[f"{reward.name}/mean"], stats[f"{reward.name}/std"] = _mean_std(present)
            stats[f"{reward.name}/missing"] = float(len(result.values) - len(present))
            stats[f"{reward.name}/time_s"] = elapsed
            for cause, count in sorted(result.failures.items()):
                stats[f"{reward.name}/failures/{cause}"] = float(count)
            for key, value in sorted(result.stats.items()):
                stats[f"{reward.name}/{key}"] = float(value)
        finite = torch.isfinite(total)
        stats["total/mean"], stats["total/std"] = _mean_std(total[finite].tolist())
        incomplete = torch.isnan(values).any(0) if values.numel() else torch.zeros_like(finite)
        stats["total/fallback"] = float((finite & incomplete).sum())
        stats["total/invalid"] = float((~finite).sum())
        return stats
