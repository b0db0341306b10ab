"""Prompt-selection methods evaluated on one split: which prompt each method uses per image, and what it scores.

Every method maps each evaluated image to one of the K prompts; its per-image Dice / IoU / recall / precision are
read from the quality table (true metrics vs ground truth). Summaries carry percentile-bootstrap CIs over images
(``evaluation.bootstrap``) and paired Dice / IoU differences against the default prompt and the best fixed prompt,
the two baselines every claim is measured against; the per-image oracle is the upper bound.
"""
from __future__ import annotations

import numpy as np

from ..evaluation.bootstrap import DEFAULT_RESAMPLES, bootstrap_mean, paired_difference
from .quality_data import METRICS, QualityData

PAIRED_METRICS = ("dice", "iou")  # metrics with paired differences against the baselines


def best_fixed_prompt(data: QualityData, train_rows: np.ndarray) -> int:
    """The prompt with the highest mean true Dice over the train images (ties -> lowest index)."""
    return int(np.argmax(data.dice[train_rows].mean(0)))


def argmax_choice(scores: np.ndarray) -> np.ndarray:
    """Per-image argmax of ``[n, K]`` scores (first index on ties)."""
    return np.argmax(np.asarray(scores), axis=1)


def chosen_metrics(data: QualityData, rows: np.ndarray, choice: np.ndarray) -> dict[str, np.ndarray]:
    """``{metric: [n]}`` of prompt ``choice[j]`` on image ``rows[j]``."""
    choice = np.asarray(choice, dtype=np.int64)
    if choice.shape != rows.shape or (choice < 0).any() or (choice >= data.num_prompts).any():
        raise ValueError(f"chosen_metrics: need one prompt index in [0, {data.num_prompts}) per image, got "
                         f"shape {choice.shape} for {rows.shape[0]} images")
    return {m: getattr(data, m)[rows, choice] for m in METRICS}


def summarize_methods(data: QualityData, rows: np.ndarray, choices: dict[str, np.ndarray], *,
                      reference: str = "default", best_fixed: str = "best_fixed",
                      n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> dict[str, dict]:
    """Per method: mean of each metric with a CI, paired Dice and IoU differences vs ``reference`` and ``best_fixed``
    (``dice_minus_default``, ``iou_minus_best_fixed``, ...),
    the prompt-usage histogram. ``choices`` must hold ``reference`` and ``best_fixed``."""
    for key in (reference, best_fixed):
        if key not in choices:
            raise ValueError(f"summarize_methods: choices lack {key!r}; every report compares against it")
    per = {name: chosen_metrics(data, rows, c) for name, c in choices.items()}
    knobs = dict(n_resamples=n_resamples, seed=seed)
    out = {}
    for name, metrics in per.items():
        entry = {m: bootstrap_mean(v, what=f"{name} {m}", **knobs).to_dict() for m, v in metrics.items()}
        for base in (reference, best_fixed):
            if base == name:
                continue
            for metric in PAIRED_METRICS:
                entry[f"{metric}_minus_{base}"] = paired_difference(
                    metrics[metric], per[base][metric], what=f"{name} - {base} {metric}", **knobs).to_dict()
        entry["prompt_counts"] = np.bincount(np.asarray(choices[name]), minlength=data.num_prompts).tolist()
        out[name] = entry
    return out
