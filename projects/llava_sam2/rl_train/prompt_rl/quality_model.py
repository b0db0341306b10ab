"""Train the reward network on a quality cache and compare it with the free baselines on held-out images.

Splits (all by image): the cache's held-out images are touched only for the final report; its train images are
split again into *fit* (network weights, calibrators) and *val* (network epoch selection, scorer selection).
The scorer that downstream steps use as their GT-free quality signal is the one with the best validation
Spearman; the network is chosen only if it beats every free baseline there (the issue's rule: no network unless
it beats the baseline), otherwise the best calibrated baseline is.
"""
from __future__ import annotations

import numpy as np

from .metrics import IsotonicCalibrator, quality_metrics, quality_metrics_ci, FAILURE_THRESHOLD
from .quality_data import QualityData, split_by_image
from .reward_net import RewardNetConfig, train_reward_net
from .scorers import network_inputs, network_scores, pred_mask_fractions, raw_free_scores

SELECTION_METRIC = "spearman"


def fit_val_split(data: QualityData, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train rows split by image into (fit rows, val rows)."""
    train = data.split_indices("train")
    is_val = split_by_image([data.meta["sample_ids"][i] for i in train], val_fraction, seed + 1)
    return train[~is_val], train[is_val]


def fit_quality_models(data: QualityData, config: RewardNetConfig, *, val_fraction: float = 0.25, epochs: int = 30,
                       lr: float = 2e-3, seed: int = 0, n_resamples: int = 1000) -> tuple[object, dict, dict]:
    """Returns ``(net, scores {name: [I, K]}, results)``; results hold per-scorer val metrics and held-out metrics
    with CIs, the calibrators, the training log and the selected scorer."""
    fit, val = fit_val_split(data, val_fraction, seed)
    held = data.split_indices("heldout")
    fractions = pred_mask_fractions(data, config.side)
    net, log = train_reward_net(config, network_inputs(data, fractions, config.mask_input, fit), data.dice[fit].ravel(),
                                network_inputs(data, fractions, config.mask_input, val), data.dice[val].ravel(),
                                epochs=epochs, lr=lr, seed=seed)
    scores = {"reward_net": network_scores(net, data, fractions)}
    calibrators = {}
    for name, raw in raw_free_scores(data).items():
        calibrator = IsotonicCalibrator().fit(raw[fit], data.dice[fit])
        scores[name], calibrators[name] = calibrator(raw), calibrator.to_dict()
    val_metrics = {name: quality_metrics(s[val], data.dice[val]) for name, s in scores.items()}
    held_metrics = {name: {k: v.to_dict() for k, v in quality_metrics_ci(
        s[held], data.dice[held], n_resamples=n_resamples, seed=seed).items()} for name, s in scores.items()}
    results = {"images": {"fit": len(fit), "val": len(val), "heldout": len(held)},
               "failure_threshold": FAILURE_THRESHOLD, "val": val_metrics, "heldout": held_metrics,
               "selected_scorer": select_scorer(val_metrics), "selection_metric": SELECTION_METRIC,
               "calibrators": calibrators, "train_log": log,
               "heldout_failure_rate": float((data.dice[held] < FAILURE_THRESHOLD).mean())}
    return net, scores, results


def select_scorer(val_metrics: dict[str, dict]) -> str:
    """The reward network if its validation Spearman beats every baseline's, else the best baseline."""
    def key(name: str) -> float:
        value = val_metrics[name][SELECTION_METRIC]
        return -np.inf if np.isnan(value) else value

    baselines = [n for n in val_metrics if n != "reward_net"]
    best_baseline = max(baselines, key=key)
    return "reward_net" if key("reward_net") > key(best_baseline) else best_baseline
