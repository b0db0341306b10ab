"""Seeded mask fixtures for the J&F reference check (tests/test_video_metrics.py).

Each case is a recipe (a dict of plain values, kept in tests/data/davis_reference_jf.json next to the reference
numbers) that :func:`build_case` turns into a ground-truth and a predicted masklet, bool ``[T, H, W]``. The masks
come from ``numpy.random.default_rng(seed)`` uniform draws only, so a recipe rebuilds the same pixels.
"""
from __future__ import annotations

import numpy as np

# Hand-made single-frame layouts on a small canvas, each one edge of the conventions (empty masks, one-pixel
# objects, the border and the boundary map's last row / column).
SPECIAL_LAYOUTS = (
    "gt_empty", "pred_empty", "both_empty", "full_vs_full", "full_vs_empty", "full_vs_blob",
    "pixel_same", "pixel_adjacent", "pixel_at_radius", "pixel_past_radius", "pixel_far",
    "pixel_top_left", "pixel_top_right", "pixel_bottom_left", "pixel_bottom_right",
    "last_row_stripe", "last_col_stripe", "first_row_vs_last_row", "left_half_vs_right_half", "checkerboard",
)


def random_blob(rng: np.random.Generator, height: int, width: int, n_shapes: int, noise: float) -> np.ndarray:
    """Union of ellipses (centres may fall outside, so shapes touch the border), XOR sparse pixel noise."""
    rows, cols = np.mgrid[:height, :width]
    mask = np.zeros((height, width), dtype=bool)
    for _ in range(n_shapes):
        centre_row, centre_col = rng.random() * (height + 4) - 2, rng.random() * (width + 4) - 2
        radius_row = 0.5 + rng.random() * max(height, 2) / 2
        radius_col = 0.5 + rng.random() * max(width, 2) / 2
        mask |= ((rows - centre_row) / radius_row) ** 2 + ((cols - centre_col) / radius_col) ** 2 <= 1
    return mask ^ (rng.random((height, width)) < noise)


def perturbed(rng: np.random.Generator, mask: np.ndarray, max_shift: int, noise: float) -> np.ndarray:
    """The mask shifted by up to ``max_shift`` pixels (no wrap-around) with sparse pixel flips."""
    height, width = mask.shape
    shift_row = int(rng.random() * (2 * max_shift + 1)) - max_shift
    shift_col = int(rng.random() * (2 * max_shift + 1)) - max_shift
    moved = np.zeros_like(mask)
    moved[max(shift_row, 0):height + min(shift_row, 0), max(shift_col, 0):width + min(shift_col, 0)] = \
        mask[max(-shift_row, 0):height + min(-shift_row, 0), max(-shift_col, 0):width + min(-shift_col, 0)]
    return moved ^ (rng.random((height, width)) < noise)


def _pixel(height: int, width: int, row: int, col: int) -> np.ndarray:
    mask = np.zeros((height, width), dtype=bool)
    mask[row, col] = True
    return mask


def special_layout(name: str, height: int, width: int, radius: int) -> tuple[np.ndarray, np.ndarray]:
    """(gt, pred) ``[H, W]`` of one named layout; ``radius`` is the F matching radius at this size."""
    empty, full = np.zeros((height, width), dtype=bool), np.ones((height, width), dtype=bool)
    blob = random_blob(np.random.default_rng(7), height, width, n_shapes=2, noise=0.0)
    middle_row, middle_col = height // 2, width // 2
    if name == "gt_empty":
        return empty, blob
    if name == "pred_empty":
        return blob, empty
    if name == "both_empty":
        return empty, empty
    if name == "full_vs_full":
        return full, full
    if name == "full_vs_empty":
        return full, empty
    if name == "full_vs_blob":
        return full, blob
    if name.startswith("pixel_"):
        gt = _pixel(height, width, middle_row, middle_col)
        offsets = {"pixel_same": 0, "pixel_adjacent": 1, "pixel_at_radius": radius, "pixel_past_radius": radius + 1,
                   "pixel_far": width - 1 - middle_col}
        if name in offsets:
            return gt, _pixel(height, width, middle_row, middle_col + offsets[name])
        corner = {"pixel_top_left": (0, 0), "pixel_top_right": (0, width - 1),
                  "pixel_bottom_left": (height - 1, 0), "pixel_bottom_right": (height - 1, width - 1)}[name]
        return _pixel(height, width, *corner), _pixel(height, width, *corner)
    if name == "last_row_stripe":
        gt = empty.copy(); gt[-1, 2:-2] = True
        pred = empty.copy(); pred[-2:, 1:-3] = True
        return gt, pred
    if name == "last_col_stripe":
        gt = empty.copy(); gt[2:-2, -1] = True
        pred = empty.copy(); pred[1:-3, -2:] = True
        return gt, pred
    if name == "first_row_vs_last_row":
        gt = empty.copy(); gt[0] = True
        pred = empty.copy(); pred[-1] = True
        return gt, pred
    if name == "left_half_vs_right_half":
        gt = empty.copy(); gt[:, :middle_col] = True
        pred = empty.copy(); pred[:, middle_col:] = True
        return gt, pred
    if name == "checkerboard":
        rows, cols = np.mgrid[:height, :width]
        return (rows + cols) % 2 == 0, (rows + cols) % 3 == 0
    raise ValueError(f"unknown layout {name!r}")


def build_case(recipe: dict) -> tuple[np.ndarray, np.ndarray]:
    """(gt, pred) bool ``[T, H, W]`` of one recipe.

    kinds: ``blobs`` (T independent frames: a blob and its perturbed copy), ``special`` (one layout),
    ``moving`` (a blob drifting across the frame, leaving it for ``absent`` frames; the prediction lags it).
    """
    height, width, frames = recipe["height"], recipe["width"], recipe.get("frames", 1)
    if recipe["kind"] == "special":
        gt, pred = special_layout(recipe["layout"], height, width, recipe["radius"])
        return gt[None], pred[None]
    rng = np.random.default_rng(recipe["seed"])
    if recipe["kind"] == "blobs":
        gts, preds = [], []
        for _ in range(frames):
            gt = random_blob(rng, height, width, recipe["n_shapes"], recipe["noise"])
            if rng.random() < recipe.get("independent", 0.0):
                pred = random_blob(rng, height, width, recipe["n_shapes"], recipe["noise"])
            else:
                pred = perturbed(rng, gt, recipe["max_shift"], recipe["noise"])
            gts.append(gt)
            preds.append(pred)
        return np.stack(gts), np.stack(preds)
    if recipe["kind"] == "moving":
        base = random_blob(rng, height, width, recipe["n_shapes"], 0.0)
        absent = set(recipe.get("absent", ()))
        gts, preds = [], []
        for t in range(frames):
            step = (t * width) // max(frames, 1) // 2
            gt = np.zeros_like(base) if t in absent else np.roll(base, step, axis=1)
            gts.append(gt)
            preds.append(perturbed(rng, gt, recipe["max_shift"], recipe["noise"]))
        return np.stack(gts), np.stack(preds)
    raise ValueError(f"unknown recipe kind {recipe['kind']!r}")


def label_map(masks: list[np.ndarray]) -> np.ndarray:
    """Objects ``[T, H, W]`` each → one uint8 label map (1-based, later objects on top): how DAVIS PNGs store them."""
    labels = np.zeros(masks[0].shape, dtype=np.uint8)
    for index, mask in enumerate(masks, start=1):
        labels[mask] = index
    return labels
