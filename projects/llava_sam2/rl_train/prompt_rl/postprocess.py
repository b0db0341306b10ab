"""Post-processing of mask *logits*: a threshold and one simple morphology step, tuned on train, tested held out.

Sa2VA's released chain binarises at logit 0 (sigmoid 0.5) after upsampling, so tuning a threshold on its binary output
is a no-op; here the threshold acts on the upsampled logits (``model.network.grounding.upsample_logits``), then one operation
from ``MORPHOLOGY`` is applied (scipy.ndimage, disk structuring elements). The grid is scored by mean Dice over the
train images; the best setting and the untouched one (threshold 0, ``none``) are then compared on held-out images with
a paired bootstrap CI. Both go through the same float16 cached logits, so the comparison is like for like.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from scipy import ndimage

from ..evaluation.bootstrap import bootstrap_mean, paired_difference
from ..rewards.mask_metrics import mask_metrics
from .quality_data import QualityData
from ..model.network.grounding import upsample_logits

THRESHOLDS = (-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0)  # logits; sigmoid 0.12 .. 0.88
MORPHOLOGY = ("none", "open1", "close1", "open2", "close2", "largest", "fill", "largest+fill")


def _disk(radius: int) -> np.ndarray:
    y, x = np.mgrid[-radius:radius + 1, -radius:radius + 1]
    return x * x + y * y <= radius * radius


def _largest_component(mask: np.ndarray) -> np.ndarray:
    labels, n = ndimage.label(mask)
    if n <= 1:
        return mask
    sizes = np.bincount(labels.ravel())[1:]  # [n] component areas
    return labels == (1 + int(np.argmax(sizes)))


def apply_morphology(mask: np.ndarray, op: str) -> np.ndarray:
    """One named operation on a bool ``[H, W]`` mask (empty masks stay empty)."""
    if op not in MORPHOLOGY:
        raise ValueError(f"morphology {op!r}: expected one of {MORPHOLOGY}")
    if op == "none" or not mask.any():
        return mask
    if op.startswith(("open", "close")):
        fn = ndimage.binary_opening if op.startswith("open") else ndimage.binary_closing
        return fn(mask, structure=_disk(int(op[-1])))
    if op == "fill":
        return ndimage.binary_fill_holes(mask)
    out = _largest_component(mask)
    return ndimage.binary_fill_holes(out) if op == "largest+fill" else out


def upsampled_logits(data: QualityData, rows: Sequence[int], choice: Sequence[int]) -> list[np.ndarray]:
    """Full-size logits ``[H, W]`` of prompt ``choice[j]`` on image ``rows[j]``."""
    size = int(data.meta["sam_image_size"])
    return [upsample_logits(torch.as_tensor(data.logits[i, k].astype(np.float32))[None], tuple(data.image_sizes[i]),
                            size)[0].numpy() for i, k in zip(rows, choice)]


def dice_grid(logits: list[np.ndarray], gts: list[np.ndarray], thresholds=THRESHOLDS,
              ops=MORPHOLOGY) -> np.ndarray:
    """Dice ``[n, T, M]`` of every (image, threshold, morphology) combination."""
    out = np.zeros((len(logits), len(thresholds), len(ops)))
    for n, (logit, gt) in enumerate(zip(logits, gts)):
        for t, threshold in enumerate(thresholds):
            base = logit > threshold
            preds = np.stack([apply_morphology(base, op) for op in ops])  # [M, H, W]
            out[n, t] = mask_metrics(preds, np.repeat(gt[None], len(ops), axis=0))["dice"].numpy()
    return out


def tune_postprocess(data: QualityData, choice_train: np.ndarray, choice_held: np.ndarray, *,
                     n_resamples: int = 1000, seed: int = 0) -> dict:
    """Pick (threshold, op) by train Dice; report held-out Dice of untouched vs tuned with a paired CI."""
    train, held = data.split_indices("train"), data.split_indices("heldout")
    grid_train = dice_grid(upsampled_logits(data, train, choice_train), [data.gt_mask(i) for i in train])
    t, m = np.unravel_index(int(np.argmax(grid_train.mean(0))), grid_train.shape[1:])
    t0, m0 = THRESHOLDS.index(0.0), MORPHOLOGY.index("none")
    held_grid = dice_grid(upsampled_logits(data, held, choice_held), [data.gt_mask(i) for i in held],
                          thresholds=(0.0, THRESHOLDS[t]), ops=("none", MORPHOLOGY[m]))
    untouched, tuned = held_grid[:, 0, 0], held_grid[:, 1, 1]
    knobs = dict(n_resamples=n_resamples, seed=seed)
    return {"best": {"threshold_logit": THRESHOLDS[t], "threshold_prob": float(1 / (1 + np.exp(-THRESHOLDS[t]))),
                     "morphology": MORPHOLOGY[m]},
            "train_grid_mean_dice": np.round(grid_train.mean(0), 4).tolist(), "thresholds": list(THRESHOLDS),
            "morphology_ops": list(MORPHOLOGY),
            "train_dice": {"untouched": float(grid_train[:, t0, m0].mean()), "tuned": float(grid_train[:, t, m].mean())},
            "heldout": {"untouched": bootstrap_mean(untouched, what="untouched", **knobs).to_dict(),
                        "tuned": bootstrap_mean(tuned, what="tuned", **knobs).to_dict(),
                        "tuned_minus_untouched": paired_difference(tuned, untouched, what="tuned - untouched",
                                                                   **knobs).to_dict()}}
