"""Reward contract: the inputs every reward reads, what it returns, and the reward registry.

A reward is a small object with a ``name``, a ``weight`` and a call (plain or ``async``) that takes
one :class:`RewardInputs` for N rollouts and returns N values, ``None`` where it has no value (the
field it needs is absent, or its source failed). It may return a :class:`RewardResult` to also
report why values are missing (failure counts per cause) and extra diagnostics.

The registry is a plain dict filled by :func:`register_reward`; ``engine/`` mirrors it into
MMEngine's registry, so this package stays framework-free.
"""
from __future__ import annotations

import math

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Union, runtime_checkable

RewardValues = list[Union[float, None]]


@dataclass
class RewardInputs:
    """Per-rollout inputs of one reward call; every list has one entry per rollout (length N = B*G).

    Fields a loop does not produce stay ``None``: loop 1 fills the masks, loop 2 the captions.

    Attributes:
        sample_ids: ``"<dataset>/<image key>#<ann id>"`` of each rollout's sample, used in messages.
        pred_masks: N predicted pixel masks, each bool ``[H, W]`` (tensor or array), or one ``[N, H, W]``.
        gt_masks: N ground-truth pixel masks, same layout and sizes as ``pred_masks``.
        pred_captions: N predicted captions.
        gt_captions: N ground-truth captions; an entry may be a list of references.
        images: N images (PIL), for rewards that look at pixels.
    """

    sample_ids: Sequence[str]
    pred_masks: Any = None
    gt_masks: Any = None
    pred_captions: Sequence[str] | None = None
    gt_captions: Sequence[str | Sequence[str]] | None = None
    images: Sequence[Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.sample_ids, str) or not isinstance(self.sample_ids, Sequence):
            raise TypeError(
                f"RewardInputs.sample_ids must be a list of N strings, got {type(self.sample_ids).__name__}"
            )
        n = len(self.sample_ids)
        for name in ("pred_masks", "gt_masks", "pred_captions", "gt_captions", "images"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(
                    f"RewardInputs.{name} has {len(value)} entries but sample_ids has {n}; "
                    "every field must hold one entry per rollout (N = B*G)"
                )

    def __len__(self) -> int:
        return len(self.sample_ids)

    def require(self, field_name: str, reward_name: str) -> Any:
        """Return a field, or raise naming the reward that needs it and the loop that fills it."""
        value = getattr(self, field_name)
        if value is None:
            raise ValueError(
                f"reward {reward_name!r} needs RewardInputs.{field_name}, which is None; "
                "use this reward only in the loop that produces that field"
            )
        return value


@dataclass
class RewardResult:
    """What a reward returns when it also reports failures.

    Attributes:
        values: N floats, ``None`` where no value exists.
        failures: cause -> number of rollouts whose value is ``None`` for that cause
            (e.g. ``"timeout"``, ``"http_500"``, ``"unparsable"``, ``"no_endpoint"``).
        stats: extra diagnostics (cache hits, request counts), summed or averaged by the caller.
    """

    values: RewardValues
    failures: dict[str, int] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Reward(Protocol):
    """The reward contract (``docs/architecture.md``): ``name``, ``weight`` and a call."""

    name: str
    weight: float

    def __call__(
        self, inputs: RewardInputs
    ) -> RewardValues | RewardResult | Awaitable[RewardValues | RewardResult]: ...


def as_result(output: RewardValues | RewardResult, n: int, name: str) -> RewardResult:
    """Normalise a reward's output to a :class:`RewardResult` of length ``n``, checking values."""
    result = output if isinstance(output, RewardResult) else RewardResult(values=list(output))
    if len(result.values) != n:
        raise ValueError(f"reward {name!r} returned {len(result.values)} values for {n} rollouts")
    for i, value in enumerate(result.values):
        if value is not None and not isinstance(value, (int, float)):
            raise TypeError(
                f"reward {name!r} returned {type(value).__name__} for rollout {i}; expected float or None"
            )
    result.values = [None if v is None else float(v) for v in result.values]
    return result


def check_weight(name: str, weight: float) -> float:
    """Validate a reward weight: finite; negative penalises (TRL's semantics), 0 logs without training on it."""
    weight = float(weight)
    if not math.isfinite(weight):
        raise ValueError(f"reward {name!r}: weight must be a finite number, got {weight}")
    return weight


REWARDS: dict[str, Callable[..., Reward]] = {}


def register_reward(name: str) -> Callable[[type], type]:
    """Class decorator: register a reward class under ``name`` (the config's ``type``)."""

    def decorator(cls: type) -> type:
        if name in REWARDS and REWARDS[name] is not cls:
            raise ValueError(f"reward type {name!r} is already registered by {REWARDS[name]!r}")
        REWARDS[name] = cls
        return cls

    return decorator


def build_reward(cfg: Mapping[str, Any] | Reward) -> Reward:
    """Build a reward from ``dict(type=<registered name or class>, **kwargs)``; objects pass through."""
    if not isinstance(cfg, Mapping):
        if isinstance(cfg, Reward):
            return cfg
        raise TypeError(f"build_reward expects a config dict or a Reward, got {type(cfg).__name__}")
    kwargs = dict(cfg)
    kind = kwargs.pop("type", None)
    if isinstance(kind, str):
        if kind not in REWARDS:
            raise ValueError(f"unknown reward type {kind!r}; registered types: {sorted(REWARDS)}")
        kind = REWARDS[kind]
    if not callable(kind):
        raise ValueError(f"reward config needs type=<name or class>, got {cfg!r}")
    return kind(**kwargs)
