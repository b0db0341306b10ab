"""Per-iteration training statistics: phase timers, rollout metrics, and the cross-rank reductions.

Everything here returns plain ``{name: float}`` dicts that ``GRPOLoop`` puts into ``after_train_iter``'s
``outputs``; MMEngine's ``RuntimeInfoHook`` copies them into the message hub (``train/<name>``) and
``LoggerHook`` prints them and forwards them to the visualizer backends (TensorBoard, W&B).

Cross-rank statistics are global, so a run on W processes logs what one process with the whole batch would:
the per-loop reward metrics come from sums over ranks (``rollout_metrics``), counts (reward failures, missing
values) are summed and other values averaged (``reduce_across_ranks``), and ``sum_across_ranks`` is the reducer
the engine injects into the algorithm (dapo's token count, the batch std of ``scale_rewards='batch'``).
"""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from mmengine.dist import all_gather_object, all_reduce, get_world_size
from torch import Tensor

from ..grpo.advantages import group_advantages, reward_moments, std_from_moments
from ..grpo.rollout import Rollout


class PhaseTimer:
    """Wall-clock seconds per named phase: ``with timer('rollout'): ...``, then ``timer.seconds``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()  # GPU work is asynchronous; charge it to the phase that queued it
            self.seconds[f"time/{phase}"] = self.seconds.get(f"time/{phase}", 0.0) + time.perf_counter() - start


def loop_names(rollouts: Sequence[Rollout]) -> list[str]:
    """The metric prefix of each rollout: its loop's name (``Rollout.loop``: ``mask_to_caption`` /
    ``caption_to_mask``); a name repeated in one step gets ``_<index>``."""
    names = []
    for index, rollout in enumerate(rollouts):
        names.append(rollout.loop if rollout.loop not in names else f"{rollout.loop}_{index}")
    return names


def sum_across_ranks(values: Tensor) -> Tensor:
    """Element-wise float64 sum of ``values`` over the ranks (the values themselves on one process)."""
    total = values.detach().to(device="cpu", dtype=torch.float64).clone()
    if get_world_size() > 1:
        all_reduce(total, op="sum")
    return total


def _rollout_sums(rollout: Rollout) -> Tensor:
    """``[8]`` float64 sums that add up over ranks: reward count / sum / sum of squares, zero-std groups,
    groups, unscored rollouts, rollouts, action elements, truncated rollouts."""
    rewards = rollout.rewards.detach().float().cpu()  # [B, G]
    _, stats = group_advantages(rewards, "group")
    moments = reward_moments(rewards)  # [3]
    B, N = rewards.shape[0], rollout.num_rollouts
    return torch.cat([moments, torch.tensor(
        [round(stats["frac_reward_zero_std"] * B), B, N - float(moments[0]), N,
         float(rollout.action_mask.sum()), float(rollout.is_truncated.sum())], dtype=torch.float64)])


def rollout_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Per loop (``<loop>/``) over the global batch: reward mean / std over scored rollouts, zero-std group and
    unscored fractions (as ``group_advantages`` defines them), the action length (caption tokens in loop 1) and
    the truncated fraction; plus the reward terms' own stats (``rollout.reward_stats``, local to the rank)."""
    if not rollouts:
        return {}
    sums = sum_across_ranks(torch.stack([_rollout_sums(r) for r in rollouts]))  # [R, 8]
    stats: dict[str, float] = {}
    for name, rollout, row in zip(loop_names(rollouts), rollouts, sums):
        count, total, _, zero_std, groups, unscored, num, elements, truncated = row[0], row[1], *row[2:].tolist()
        stats[f"{name}/reward_mean"] = float(total / count) if count > 0 else float("nan")
        stats[f"{name}/reward_std"] = float(std_from_moments(row[:3]))
        stats[f"{name}/frac_reward_zero_std"] = zero_std / groups
        stats[f"{name}/frac_unscored"] = unscored / num
        stats[f"{name}/completion_length"] = elements / num
        stats[f"{name}/truncated_frac"] = truncated / num
        stats.update({f"{name}/{key}": float(value) for key, value in rollout.reward_stats.items()})
    return stats


def mean_of_logs(logs: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, float]:
    """Average each key over the ``train_step`` log dicts of one iteration (keys may be absent in some)."""
    values: dict[str, list[float]] = defaultdict(list)
    for log in logs:
        for key, value in log.items():
            values[key].append(float(value.detach()) if torch.is_tensor(value) else float(value))
    return {key: sum(v) / len(v) for key, v in values.items()}


def is_count_key(key: str) -> bool:
    """Stats that count events (reward failures, missing reward values, fallbacks): summed over ranks."""
    return "/failures/" in key or key.endswith(("/missing", "/fallback", "/invalid"))


def zero_absent_counts(stats: Mapping[str, float], logged: Iterable[str]) -> dict[str, float]:
    """``stats`` plus a 0 for every count (``is_count_key``) among ``logged`` (the names logged at earlier
    iterations) that this iteration did not report. The message hub keeps the last value of a name that is not
    updated, so a failure cause that stopped would otherwise repeat its old count at every later iteration."""
    return {**{key: 0.0 for key in logged if is_count_key(key) and key not in stats}, **stats}


def reduce_across_ranks(stats: Mapping[str, float]) -> dict[str, float]:
    """Every logged stat over ranks: the sum for counts (``is_count_key``), else the NaN-aware mean.

    Ranks may report different key sets (a reward failure seen on one rank only): the union is gathered first and
    a key a rank lacks counts as absent there. A stat that is NaN or inf on a rank is left out of that key's
    reduction (NaN where no rank had a finite value).
    """
    if get_world_size() == 1:
        return dict(stats)
    keys = sorted(set().union(*all_gather_object(sorted(stats))))
    values = torch.tensor([float(stats.get(k, float("nan"))) for k in keys], dtype=torch.float64)  # [K]
    is_finite = torch.isfinite(values)
    packed = torch.stack([values.nan_to_num(0.0, posinf=0.0, neginf=0.0), is_finite.double()])  # [2, K]
    all_reduce(packed, op="sum")
    means = packed[0] / packed[1]  # [K], NaN where no rank had a value
    sums = torch.where(packed[1] > 0, packed[0], means)  # [K]
    return {key: float(sums[i] if is_count_key(key) else means[i]) for i, key in enumerate(keys)}
