"""Percentile-bootstrap confidence intervals over evaluation samples (Efron & Tibshirani 1993, ch. 13).

Every statistic here is a function of per-sample columns, and a bootstrap replicate resamples whole
samples (rows) with replacement, so paired columns stay paired:

* mean:   θ = mean_i x_i                                  (gIoU, METEOR, cycle IoU)
* ratio:  θ = Σ_i a_i / (Σ_i b_i + eps)                   (cIoU = Σ∩ / Σ∪: resample samples, not pixels)
* paired difference of two systems on the same samples:
          θ = mean_i (x_i − y_i)   or   Σa_i/Σb_i − Σc_i/Σd_i

The CI is the (α/2, 1 − α/2) percentile of R replicates of θ (``method='percentile'``), computed with
``scipy.stats.bootstrap`` (vectorised, seeded with ``numpy.random.default_rng(seed)``). A paired
difference whose CI excludes 0 is the evidence for "system A beats system B" on this split; two
overlapping per-system CIs say little, because the per-sample scores of two systems are correlated.

Fewer than 2 samples: the point estimate is returned with NaN bounds (no interval exists).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

DEFAULT_RESAMPLES = 1000
DEFAULT_CONFIDENCE = 0.95
RATIO_EPS = 1e-10  # Sa2VA RES.evaluate's cIoU epsilon, so a bootstrapped cIoU equals the reported one


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap CI.

    Attributes:
        value: the statistic on the full sample.
        low / high: CI bounds (NaN when n < 2).
        n: number of samples (rows) the statistic is computed over.
        confidence: CI level, e.g. 0.95.
        n_resamples: bootstrap replicates R.
    """

    value: float
    low: float
    high: float
    n: int
    confidence: float = DEFAULT_CONFIDENCE
    n_resamples: int = DEFAULT_RESAMPLES

    @property
    def excludes_zero(self) -> bool:
        """True when the whole CI lies on one side of 0 (a paired difference is significant)."""
        return bool(self.low > 0 or self.high < 0)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Estimate":
        return cls(**{k: data[k] for k in ("value", "low", "high", "n", "confidence", "n_resamples") if k in data})

    def format(self, digits: int = 3, scale: float = 1.0) -> str:
        """``'0.512 [0.480, 0.545]'`` (bounds omitted when NaN)."""
        value = f"{self.value * scale:.{digits}f}"
        if math.isnan(self.low) or math.isnan(self.high):
            return value
        return f"{value} [{self.low * scale:.{digits}f}, {self.high * scale:.{digits}f}]"


def _columns(columns: Sequence[Sequence[float]], what: str) -> list[np.ndarray]:
    """Equal-length float64 1-D columns, or a ValueError naming ``what``."""
    arrays = [np.asarray(c, dtype=np.float64).reshape(-1) for c in columns]
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise ValueError(f"{what}: paired columns must have one value per sample each, got lengths "
                         f"{[len(a) for a in arrays]}")
    if lengths == {0}:
        raise ValueError(f"{what}: no samples; evaluate at least one sample first")
    for array in arrays:
        if not np.isfinite(array).all():
            raise ValueError(f"{what}: non-finite per-sample value at rows "
                             f"{np.flatnonzero(~np.isfinite(array))[:5].tolist()}; fix the records first")
    return arrays


def _check_knobs(n_resamples: int, confidence: float) -> None:
    if int(n_resamples) < 1:
        raise ValueError(f"bootstrap: n_resamples={n_resamples}; use a positive count (1000 is typical)")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"bootstrap: confidence={confidence}; use a level in (0, 1), e.g. 0.95")


def bootstrap_statistic(
    columns: Sequence[Sequence[float]],
    statistic: Callable[..., np.ndarray],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    what: str = "bootstrap",
) -> Estimate:
    """Percentile CI of ``statistic(*columns, axis=-1)`` with rows resampled jointly.

    Args:
        columns: K paired columns of N per-sample values.
        statistic: vectorised function of the K columns along ``axis`` (shapes ``[..., N]`` → ``[...]``).
        seed: seeds ``numpy.random.default_rng``; the same seed and data give the same CI.
    """
    _check_knobs(n_resamples, confidence)
    arrays = _columns(columns, what)
    value = float(statistic(*arrays, axis=-1))
    n = len(arrays[0])
    if n < 2:
        return Estimate(value, math.nan, math.nan, n, confidence, int(n_resamples))
    result = stats.bootstrap(tuple(arrays), statistic, n_resamples=int(n_resamples), paired=True, vectorized=True,
                             axis=-1, confidence_level=confidence, method="percentile",
                             rng=np.random.default_rng(seed))
    interval = result.confidence_interval
    return Estimate(value, float(interval.low), float(interval.high), n, confidence, int(n_resamples))


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def _ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.sum(a, axis=axis) / (np.sum(b, axis=axis) + RATIO_EPS)


def _mean_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x - y, axis=axis)


def _ratio_difference(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray, axis: int = -1) -> np.ndarray:
    return _ratio(a, b, axis) - _ratio(c, d, axis)


def bootstrap_mean(values: Sequence[float], **knobs) -> Estimate:
    """CI of ``mean_i x_i``. ``knobs``: n_resamples, confidence, seed, what."""
    return bootstrap_statistic([values], _mean, **knobs)


def bootstrap_ratio(numerators: Sequence[float], denominators: Sequence[float], **knobs) -> Estimate:
    """CI of ``Σ a_i / (Σ b_i + eps)`` (cIoU with a = intersections, b = unions)."""
    return bootstrap_statistic([numerators, denominators], _ratio, **knobs)


def paired_difference(values_a: Sequence[float], values_b: Sequence[float], **knobs) -> Estimate:
    """CI of ``mean_i (x_i − y_i)`` for two systems scored on the same samples, in the same order."""
    return bootstrap_statistic([values_a, values_b], _mean_difference, **knobs)


def paired_ratio_difference(
    numerators_a: Sequence[float], denominators_a: Sequence[float],
    numerators_b: Sequence[float], denominators_b: Sequence[float], **knobs,
) -> Estimate:
    """CI of ``Σa/Σb − Σc/Σd`` (cIoU of system A minus cIoU of system B) on the same samples."""
    return bootstrap_statistic([numerators_a, denominators_a, numerators_b, denominators_b],
                               _ratio_difference, **knobs)
