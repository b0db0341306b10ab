"""Markdown tables of the prompt-RL experiments (``sa2va-rl prompt-rl report``, steps/write_report.py, adds the
charts and file I/O).

Every number is ``value [low, high]`` with its percentile-bootstrap CI over held-out images; differences are paired
on the same images. ``compare_checkpoints`` measures a fine-tuned checkpoint against its base on the *same* samples,
prompts and held-out split (both caches from ``sa2va-rl prompt-rl quality-dataset``, the second with ``--same-as``).
"""
from __future__ import annotations

import math

import numpy as np

from ..evaluation.bootstrap import Estimate, bootstrap_mean, paired_difference
from ..evaluation.report import is_marked
from .quality_data import QualityData
from .selection import best_fixed_prompt

QUALITY_COLUMNS = ("pearson", "spearman", "mae", "auroc")


def fmt(entry: dict | Estimate | None, digits: int = 3) -> str:
    """``0.512 [0.480, 0.545]`` from an Estimate or its dict; ``n/a`` when undefined."""
    if entry is None:
        return "n/a"
    est = entry if isinstance(entry, Estimate) else Estimate.from_dict(entry)
    return "n/a" if math.isnan(est.value) else est.format(digits)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def quality_table(results: dict) -> str:
    """Held-out quality metrics per scorer (rows) with CIs, plus the validation Spearman used for selection."""
    rows = []
    for name, metrics in results["heldout"].items():
        val = results["val"][name]["spearman"]
        mark = " (selected)" if name == results["selected_scorer"] else ""
        rows.append([f"{name}{mark}", *(fmt(metrics[c]) for c in QUALITY_COLUMNS),
                     "n/a" if val is None or (isinstance(val, float) and math.isnan(val)) else f"{val:.3f}"])
    return table(["scorer", "Pearson", "Spearman", "MAE", f"AUROC (Dice < {results['failure_threshold']})",
                  "val Spearman"], rows)


def selection_table(results: dict) -> str:
    """Held-out Dice / IoU / recall / precision per method, its paired Dice gain over default and best fixed and
    its paired IoU gain over default (``n/a`` in results written before IoU differences were kept)."""
    rows = []
    for name, m in sorted(results["methods"].items(), key=lambda kv: -kv[1]["dice"]["value"]):
        rows.append([name, fmt(m["dice"]), fmt(m["iou"]), fmt(m["recall"]), fmt(m["precision"]),
                     fmt(m.get("dice_minus_default")), fmt(m.get("dice_minus_best_fixed")),
                     fmt(m.get("iou_minus_default"))])
    return table(["method", "Dice", "IoU", "recall", "precision", "ΔDice vs default", "ΔDice vs best fixed",
                  "ΔIoU vs default"], rows)


def postprocess_table(results: dict) -> str:
    rows = []
    for name, r in results["choices"].items():
        best = r["best"]
        rows.append([f"{name} ({results['prompt_labels'][r['prompt_index']]})",
                     f"logit > {best['threshold_logit']:+.1f} (p > {best['threshold_prob']:.2f}), {best['morphology']}",
                     fmt(r["heldout"]["untouched"]), fmt(r["heldout"]["tuned"]),
                     fmt(r["heldout"]["tuned_minus_untouched"])])
    return table(["prompt", "tuned on train", "held-out Dice untouched", "held-out Dice tuned", "Δ (paired)"], rows)


def compare_checkpoints(base: QualityData, tuned: QualityData, *, n_resamples: int = 1000, seed: int = 0) -> dict:
    """Held-out Dice of base vs fine-tuned under the default prompt, the base's best fixed prompt and the oracle."""
    if base.meta["sample_ids"] != tuned.meta["sample_ids"] or not np.array_equal(base.is_heldout, tuned.is_heldout) \
            or base.meta["prompt_labels"] != tuned.meta["prompt_labels"]:
        raise ValueError("compare_checkpoints: the two caches differ in samples, prompts or split; build the second "
                         "with `sa2va-rl prompt-rl quality-dataset --same-as <base cache>`")
    held = base.split_indices("heldout")
    k_best = best_fixed_prompt(base, base.split_indices("train"))
    picks = {"default prompt": lambda d: d.dice[held, 0], "best fixed prompt": lambda d: d.dice[held, k_best],
             "oracle prompt": lambda d: d.dice[held].max(1), "mean over prompts": lambda d: d.dice[held].mean(1)}
    knobs = dict(n_resamples=n_resamples, seed=seed)
    return {name: {"base": bootstrap_mean(pick(base), **knobs).to_dict(),
                   "tuned": bootstrap_mean(pick(tuned), **knobs).to_dict(),
                   "tuned_minus_base": paired_difference(pick(tuned), pick(base), **knobs).to_dict()}
            for name, pick in picks.items()}


def finetune_table(comparison: dict) -> str:
    return table(["held-out Dice under", "base", "fine-tuned", "Δ (paired)"],
                 [[name, fmt(r["base"]), fmt(r["tuned"]), fmt(r["tuned_minus_base"])]
                  for name, r in comparison.items()])


def verdict(diff: dict, what: str) -> str:
    """One sentence from a paired difference: significant gain / loss, or no measurable difference."""
    est = Estimate.from_dict(diff)
    if math.isnan(est.low):
        return f"{what}: {fmt(est)} (no interval)."
    if is_marked(est):  # the evaluation report's rule: CI excludes 0 as printed, and |value| >= MIN_EFFECT
        return f"{what}: {'better' if est.value > 0 else 'worse'} by {fmt(est)} (95% CI excludes 0)."
    return f"{what}: no measurable difference, {fmt(est)}."
