"""How well a GT-free quality score predicts the true Dice, with image-level bootstrap CIs, and the free baselines.

Metrics of predicted scores s against true Dice d over N (sample, prompt) pairs:

* Pearson r(s, d); Spearman rho = Pearson of the ranks (average ranks for ties);
* MAE = mean |s - d| (meaningful only for calibrated scores);
* failure AUROC: failures are pairs with d < ``failure_threshold`` (0.5); AUROC = P(s_failure < s_success) + 0.5 P(tie)
  (Mann-Whitney U / (n_f n_s)), i.e. how well a low score flags a failed mask. Undefined (NaN) when the pairs hold
  no failure or no success.

A sample contributes K correlated pairs (one per prompt), so CIs resample *samples* (images), keeping their K pairs
together (``evaluation.bootstrap.bootstrap_statistic`` over 2K paired columns). Constant scores give NaN
correlations, reported as such ("n/a"), never as 0.

Free baselines (no training beyond a 1-D calibration): SAM2's IoU head and SAM's stability score
``|logit > +1| / |logit > -1|`` of the low-res logits (Kirillov et al. 2023; 0 when both sets are empty). Each is
calibrated to Dice by isotonic regression (``scipy.optimize.isotonic_regression``) fitted on train pairs only.
Isotonic fits are step functions, whose flat steps would tie scores the raw signal orders; the calibrator adds
``TIE_BREAK * normalised raw score`` (1e-6) so calibration keeps the raw order (Spearman / AUROC unchanged) and
moves MAE by at most 1e-6.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import stats
from scipy.optimize import isotonic_regression

from ..evaluation.bootstrap import DEFAULT_RESAMPLES, Estimate, bootstrap_statistic

FAILURE_THRESHOLD = 0.5
TIE_BREAK = 1e-6
METRIC_NAMES = ("pearson", "spearman", "mae", "auroc")


def _pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson along the last axis; NaN where either side is constant."""
    xc, yc = x - x.mean(-1, keepdims=True), y - y.mean(-1, keepdims=True)
    den = np.sqrt((xc * xc).sum(-1) * (yc * yc).sum(-1))
    defined = (np.ptp(x, axis=-1) > 0) & (np.ptp(y, axis=-1) > 0)  # exact test: the mean leaves round-off
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(defined, (xc * yc).sum(-1) / np.where(defined, den, 1.0), np.nan)


def _spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return _pearson(stats.rankdata(x, axis=-1), stats.rankdata(y, axis=-1))


def _failure_auroc(score: np.ndarray, dice: np.ndarray, threshold: float) -> np.ndarray:
    """P(score of a failure < score of a success) along the last axis, via the rank-sum (Mann-Whitney) formula."""
    ranks = stats.rankdata(-score, axis=-1)  # rank 1 = highest score; failures should rank high in -score
    is_failure = dice < threshold
    n_f, n = is_failure.sum(-1), score.shape[-1]
    n_s = n - n_f
    u = (ranks * is_failure).sum(-1) - n_f * (n_f + 1) / 2  # pairs where -score(failure) > -score(success)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((n_f > 0) & (n_s > 0), u / np.maximum(n_f * n_s, 1), np.nan)


def quality_metrics(score, dice, failure_threshold: float = FAILURE_THRESHOLD) -> dict[str, float]:
    """Pearson, Spearman, MAE and failure AUROC of scores vs true Dice (flattened), plus counts."""
    s, d = _flat(score, "score"), _flat(dice, "dice")
    if s.shape != d.shape:
        raise ValueError(f"quality_metrics: {s.size} scores but {d.size} Dice values; pass one score per pair")
    return {"pearson": float(_pearson(s, d)), "spearman": float(_spearman(s, d)), "mae": float(np.abs(s - d).mean()),
            "auroc": float(_failure_auroc(s, d, failure_threshold)), "n_pairs": int(s.size),
            "n_failures": int((d < failure_threshold).sum())}


def _flat(values, what: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.size == 0:
        raise ValueError(f"quality_metrics: no {what} values")
    if not np.isfinite(array).all():
        raise ValueError(f"quality_metrics: {what} holds NaN/inf at {np.flatnonzero(~np.isfinite(array))[:5].tolist()}")
    return array


def quality_metrics_ci(score: np.ndarray, dice: np.ndarray, *, failure_threshold: float = FAILURE_THRESHOLD,
                       n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> dict[str, Estimate]:
    """Every metric of ``quality_metrics`` with a CI from resampling samples (rows of ``[I, K]`` arrays)."""
    score, dice = np.asarray(score, dtype=np.float64), np.asarray(dice, dtype=np.float64)
    if score.ndim != 2 or score.shape != dice.shape:
        raise ValueError(f"quality_metrics_ci: expected score and dice of equal shape [I, K], got {score.shape} "
                         f"and {dice.shape}")
    K = score.shape[1]
    columns = [score[:, k] for k in range(K)] + [dice[:, k] for k in range(K)]
    fns = {"pearson": lambda s, d: _pearson(s, d), "spearman": lambda s, d: _spearman(s, d),
           "mae": lambda s, d: np.abs(s - d).mean(-1),
           "auroc": lambda s, d: _failure_auroc(s, d, failure_threshold)}
    out = {}
    for name, fn in fns.items():
        def statistic(*cols, axis=-1, fn=fn):
            s = np.concatenate(cols[:K], axis=-1)  # [..., I*K] (pairs of the resampled samples)
            d = np.concatenate(cols[K:], axis=-1)
            return fn(s, d)

        full = float(statistic(*columns))
        if math.isnan(full):  # undefined on the full split (constant scores, no failure): no interval either
            out[name] = Estimate(full, math.nan, math.nan, score.shape[0], n_resamples=n_resamples)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out[name] = bootstrap_statistic(columns, statistic, n_resamples=n_resamples, seed=seed,
                                            what=f"quality metric {name}")
    return out


def stability_score(logits: np.ndarray, offset: float = 1.0) -> np.ndarray:
    """SAM's stability score of mask logits ``[..., h, w]``: IoU of {x > +offset} and {x > -offset} -> ``[...]``."""
    logits = np.asarray(logits, dtype=np.float32)
    inner = (logits > offset).sum((-2, -1)).astype(np.float64)
    outer = (logits > -offset).sum((-2, -1)).astype(np.float64)
    return np.where(outer > 0, inner / np.maximum(outer, 1), 0.0)


class IsotonicCalibrator:
    """Monotone map raw score -> Dice fitted on train pairs; predictions interpolate between fitted knots."""

    def fit(self, raw, dice) -> "IsotonicCalibrator":
        x, y = _flat(raw, "raw score"), _flat(dice, "dice")
        if x.size != y.size or x.size < 2:
            raise ValueError(f"IsotonicCalibrator.fit: need >= 2 paired values, got {x.size} scores, {y.size} Dice")
        order = np.argsort(x, kind="stable")
        fitted = isotonic_regression(y[order], increasing=True).x
        self.knots, inverse = np.unique(x[order], return_inverse=True)
        self.values = np.bincount(inverse, weights=fitted) / np.bincount(inverse)  # mean fit per distinct x
        return self

    def __call__(self, raw) -> np.ndarray:
        if not hasattr(self, "knots"):
            raise ValueError("IsotonicCalibrator: call fit(train_scores, train_dice) first")
        raw = np.asarray(raw, dtype=np.float64)
        span = max(float(self.knots[-1] - self.knots[0]), 1e-12)
        return np.interp(raw, self.knots, self.values) + TIE_BREAK * (raw - self.knots[0]) / span

    def to_dict(self) -> dict:
        return {"knots": self.knots.tolist(), "values": self.values.tolist()}
