"""Per-iteration training statistics: phase timers, rollout metrics, and the one cross-rank reduction.

Everything here returns plain ``{name: float}`` dicts that ``GRPOLoop`` puts into ``after_train_iter``'s
``outputs``; MMEngine's ``RuntimeInfoHook`` copies them into the message hub (``train/<name>``) and
``LoggerHook`` prints them and forwards them to the visualizer backends (TensorBoard, W&B).
"""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from mmengine.dist import all_reduce, get_world_size

from ..grpo.advantages import group_advantages
from ..grpo.rollout import CaptionReplay, MaskReplay, Rollout

# Metric prefix of each loop, looked up by the type of the rollout's replay inputs (DESIGN §3).
LOOP_NAMES = {CaptionReplay: "loop1", MaskReplay: "loop2"}


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
    """``loop1`` / ``loop2`` by replay type; ``rollout<i>`` for other types; repeated names get ``_<i>``."""
    names = []
    for index, rollout in enumerate(rollouts):
        name = LOOP_NAMES.get(type(rollout.replay), f"rollout{index}")
        names.append(name if name not in names else f"{name}_{index}")
    return names


def rollout_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Per loop (``<loop>/``): the reward statistics of ``group_advantages`` (mean/std over scored rollouts,
    zero-std group and unscored fractions), the action length (caption tokens in loop 1), the truncated
    fraction and the reward terms' own stats (``rollout.reward_stats``)."""
    stats: dict[str, float] = {}
    for name, rollout in zip(loop_names(rollouts), rollouts):
        _, reward_stats = group_advantages(rollout.rewards.detach().float().cpu(), "group")
        stats.update({f"{name}/{key}": value for key, value in reward_stats.items()})
        stats[f"{name}/completion_length"] = rollout.action_mask.sum(dim=-1).float().mean().item()
        stats[f"{name}/truncated_frac"] = rollout.is_truncated.float().mean().item()
        stats.update({f"{name}/{key}": float(value) for key, value in rollout.reward_stats.items()})
    return stats


def mean_of_logs(logs: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, float]:
    """Average each key over the ``train_step`` log dicts of one iteration (keys may be absent in some)."""
    values: dict[str, list[float]] = defaultdict(list)
    for log in logs:
        for key, value in log.items():
            values[key].append(float(value.detach()) if torch.is_tensor(value) else float(value))
    return {key: sum(v) / len(v) for key, v in values.items()}


def reduce_across_ranks(stats: Mapping[str, float]) -> dict[str, float]:
    """NaN-aware mean of every stat over ranks (the only cross-rank reduction of logged values).

    Keys are sorted so every rank packs the same order; every rank must report the same key set. A stat that is
    NaN on a rank (nothing scored there) is left out of that key's mean.
    """
    if get_world_size() == 1:
        return dict(stats)
    keys = sorted(stats)
    values = torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64)  # [K]
    is_finite = torch.isfinite(values)
    packed = torch.stack([values.nan_to_num(0.0, posinf=0.0, neginf=0.0), is_finite.double()])  # [2, K]
    all_reduce(packed, op="sum")
    means = packed[0] / packed[1]  # [K], NaN where no rank had a value
    return dict(zip(keys, means.tolist()))
