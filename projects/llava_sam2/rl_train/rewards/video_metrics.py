"""Video object segmentation metrics: region similarity J, boundary measure F and J&F, as DAVIS 2017 defines them.

Per frame, with P the predicted and G the ground-truth pixel set of one object::

    J = |P ∩ G| / |P ∪ G|                      (1.0 when both masks are empty)
    F = 2 · precision · recall / (precision + recall)

F compares the two masks' boundary maps. A boundary pixel of one mask counts as matched when a boundary
pixel of the other lies within ``r`` pixels (Euclidean), ``r = ceil(0.008 · image diagonal)``: 4 pixels at
240×427, 8 at DAVIS's 480×854. precision is the matched fraction of the predicted boundary, recall that of
the ground-truth boundary. When one boundary map is empty: both empty gives F = 1, exactly one empty gives
F = 0. The boundary map marks a pixel whose value differs from its right, lower or lower-right neighbour; in
the last row only the right neighbour is compared, in the last column only the lower one, and the
bottom-right pixel is never a boundary. So a mask that fills the whole frame (or a single pixel in the
bottom-right corner) has an empty boundary map.

Per object, over its scored frames, each of J and F is summarised as DAVIS does:

    Mean   = mean over frames
    Recall = fraction of frames with a value > 0.5
    Decay  = mean of the first quarter of the frames − mean of the last quarter (the four quarters split
             ``round(linspace(1, T, 5))`` and share their edge frames)

and a split as the mean of those per-object numbers over all objects, with J&F-Mean = (J-Mean + F-Mean) / 2.
The semi-supervised protocol scores frames 1 … T−2 (the first frame's mask is the method's input, and the
last frame is left out as well); the referring protocols (MeViS, ReVOS, Ref-DAVIS as Sa2VA evaluates them)
score every frame, with one object per expression.

They live among the rewards because loop 1 on video scores with them (``VideoJFReward``, ``video_jf``); the held-out
evaluation (``evaluation.video_metrics``) reads the same functions.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from scipy.spatial import cKDTree

from .base import RewardInputs, check_weight, register_reward

BOUNDARY_TOLERANCE = 0.008  # matching distance as a fraction of the image diagonal
RECALL_THRESHOLD = 0.5  # a frame counts towards Recall when its score is above this
DECAY_QUARTERS = 4  # Decay compares the first and the last of this many time bins


def _as_masks(masks, what: str) -> np.ndarray:
    array = np.asarray(masks)
    if array.ndim not in (2, 3):
        raise ValueError(f"{what}: expected a mask [H, W] or a masklet [T, H, W], got shape {array.shape}")
    return array.astype(bool)


def _pair(gt_masks, pred_masks) -> tuple[np.ndarray, np.ndarray]:
    gt, pred = _as_masks(gt_masks, "gt_masks"), _as_masks(pred_masks, "pred_masks")
    if gt.shape != pred.shape:
        raise ValueError(f"gt_masks {gt.shape} and pred_masks {pred.shape} differ in shape")
    return gt, pred


def region_similarity(gt_masks, pred_masks) -> np.ndarray:
    """J of each frame: ``[T]`` for masklets ``[T, H, W]``, a 0-d array for masks ``[H, W]``."""
    gt, pred = _pair(gt_masks, pred_masks)
    intersection = np.count_nonzero(gt & pred, axis=(-2, -1))
    union = np.count_nonzero(gt | pred, axis=(-2, -1))
    return np.where(union == 0, 1.0, intersection / np.maximum(union, 1))


def boundary_map(masks) -> np.ndarray:
    """One-pixel-wide boundary of each mask (module doc), bool of the input's shape ``[..., H, W]``."""
    mask = np.asarray(masks).astype(bool)
    edge = np.zeros_like(mask)
    inner = mask[..., :-1, :-1]
    edge[..., :-1, :-1] = (inner != mask[..., :-1, 1:]) | (inner != mask[..., 1:, :-1]) | (inner != mask[..., 1:, 1:])
    edge[..., -1, :-1] = mask[..., -1, :-1] != mask[..., -1, 1:]
    edge[..., :-1, -1] = mask[..., :-1, -1] != mask[..., 1:, -1]
    return edge


def boundary_tolerance_pixels(height: int, width: int, bound_th: float = BOUNDARY_TOLERANCE) -> int:
    """Matching radius r: ``bound_th`` pixels when it is ≥ 1, else ``ceil(bound_th · diagonal)``."""
    if bound_th >= 1:
        if bound_th != int(bound_th):
            raise ValueError(f"bound_th={bound_th}: an absolute tolerance must be a whole number of pixels")
        return int(bound_th)
    if bound_th <= 0:
        raise ValueError(f"bound_th={bound_th}: must be positive")
    return math.ceil(bound_th * math.sqrt(height * height + width * width))


def tolerance_disk(radius: int) -> np.ndarray:
    """The offsets within ``radius`` of the centre, bool ``[2r+1, 2r+1]``: the set F's matching uses."""
    offsets = np.arange(-radius, radius + 1)
    return offsets[:, None] ** 2 + offsets[None, :] ** 2 <= radius * radius


def _matched_per_frame(points: np.ndarray, targets: np.ndarray, radius: int, n_frames: int) -> np.ndarray:
    """Per frame, how many ``points`` have a ``targets`` pixel of the same frame within ``radius``.

    Both are boundary pixels as (frame, row, col) ``[N, 3]`` in frame order (``np.argwhere``'s). The count equals
    that of ``points`` inside the dilation of the frame's ``targets`` by :func:`tolerance_disk`; a k-d tree over a
    frame's boundary pixels costs milliseconds, where a full-frame dilation costs ~0.1 s at 480×854.
    """
    frames = np.arange(n_frames + 1)
    point_bounds = np.searchsorted(points[:, 0], frames)
    target_bounds = np.searchsorted(targets[:, 0], frames)
    matched = np.zeros(n_frames, dtype=np.int64)
    for frame in range(n_frames):
        frame_points = points[point_bounds[frame]:point_bounds[frame + 1], 1:]
        frame_targets = targets[target_bounds[frame]:target_bounds[frame + 1], 1:]
        if len(frame_points) == 0 or len(frame_targets) == 0:
            continue
        _, nearest = cKDTree(frame_targets).query(frame_points, k=1, distance_upper_bound=radius + 0.5)
        found = nearest < len(frame_targets)
        offsets = frame_points[found] - frame_targets[nearest[found]]  # integers: the squared distance is exact
        matched[frame] = np.count_nonzero(np.einsum("ij,ij->i", offsets, offsets) <= radius * radius)
    return matched


def _f_measure(n_gt: int, n_pred: int, matched_gt: int, matched_pred: int) -> float:
    """F of one frame from its boundary pixel counts (module doc, including the empty-boundary cases)."""
    if n_gt == 0 or n_pred == 0:
        return 1.0 if n_gt == n_pred else 0.0
    precision = matched_pred / float(n_pred)
    recall = matched_gt / float(n_gt)
    if precision + recall == 0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


def boundary_measure(gt_masks, pred_masks, bound_th: float = BOUNDARY_TOLERANCE) -> np.ndarray:
    """F of each frame: ``[T]`` for masklets ``[T, H, W]``, a 0-d array for masks ``[H, W]``."""
    gt, pred = _pair(gt_masks, pred_masks)
    height, width = gt.shape[-2:]
    radius = boundary_tolerance_pixels(height, width, bound_th=bound_th)
    gt_points = np.argwhere(boundary_map(gt.reshape(-1, height, width)))  # [N, 3] (frame, row, col)
    pred_points = np.argwhere(boundary_map(pred.reshape(-1, height, width)))
    n_frames = gt.reshape(-1, height, width).shape[0]
    n_gt, n_pred = np.bincount(gt_points[:, 0], minlength=n_frames), np.bincount(pred_points[:, 0], minlength=n_frames)
    matched_gt = _matched_per_frame(gt_points, pred_points, radius, n_frames)
    matched_pred = _matched_per_frame(pred_points, gt_points, radius, n_frames)
    scores = [_f_measure(*counts) for counts in zip(n_gt.tolist(), n_pred.tolist(), matched_gt.tolist(),
                                                     matched_pred.tolist())]
    return np.asarray(scores, dtype=np.float64).reshape(gt.shape[:-2])


@dataclass(frozen=True)
class SeriesStatistics:
    """DAVIS's summary of one object's per-frame scores (module doc)."""

    mean: float
    recall: float
    decay: float


def series_statistics(values) -> SeriesStatistics:
    """Mean, Recall and Decay of per-frame scores ``[T]``, T ≥ 1."""
    scores = np.asarray(values, dtype=np.float64)
    if scores.ndim != 1 or len(scores) == 0:
        raise ValueError(f"expected per-frame scores [T] with T >= 1, got shape {scores.shape}")
    edges = (np.round(np.linspace(1, len(scores), DECAY_QUARTERS + 1) + 1e-10) - 1).astype(np.int64)
    first, last = scores[edges[0]:edges[1] + 1], scores[edges[-2]:edges[-1] + 1]
    return SeriesStatistics(mean=float(np.mean(scores)),
                            recall=float(np.mean(scores > RECALL_THRESHOLD)),
                            decay=float(np.mean(first) - np.mean(last)))


@dataclass(frozen=True)
class MaskletScores:
    """Per-frame J and F of one object over its scored frames (both ``[T]`` float64)."""

    j: np.ndarray
    f: np.ndarray

    @property
    def j_and_f(self) -> float:
        """(mean J + mean F) / 2 over the scored frames."""
        return (float(np.mean(self.j)) + float(np.mean(self.f))) / 2


def score_masklet(gt_masks, pred_masks, *, semi_supervised: bool = False,
                  bound_th: float = BOUNDARY_TOLERANCE) -> MaskletScores:
    """J and F of each frame of one object, masklets bool ``[T, H, W]``.

    ``semi_supervised=True`` scores frames 1 … T−2 as DAVIS's semi-supervised protocol does (T ≥ 3);
    otherwise every frame is scored, as the referring protocols do.
    """
    gt, pred = _pair(gt_masks, pred_masks)
    if gt.ndim != 3:
        raise ValueError(f"expected masklets [T, H, W], got shape {gt.shape}")
    if semi_supervised:
        if len(gt) < 3:
            raise ValueError(f"semi_supervised scoring drops the first and last frame; needs T >= 3, got {len(gt)}")
        gt, pred = gt[1:-1], pred[1:-1]
    elif len(gt) == 0:
        raise ValueError("expected at least one frame")
    return MaskletScores(j=region_similarity(gt, pred), f=boundary_measure(gt, pred, bound_th=bound_th))


def j_and_f(gt_masks, pred_masks, *, bound_th: float = BOUNDARY_TOLERANCE) -> float:
    """(mean J + mean F) / 2 of one object over all frames of masklets ``[T, H, W]``."""
    return score_masklet(gt_masks, pred_masks, bound_th=bound_th).j_and_f


@dataclass(frozen=True)
class VideoSummary:
    """A split's scores as DAVIS reports them.

    Attributes:
        metrics: ``J&F-Mean``, ``J-Mean``, ``J-Recall``, ``J-Decay``, ``F-Mean``, ``F-Recall``, ``F-Decay``:
            each the mean over objects of that object's statistic.
        per_object: object name → ``{"J-Mean", "F-Mean"}``.
    """

    metrics: dict[str, float]
    per_object: dict[str, dict[str, float]]


def summarize_objects(scores: Mapping[str, MaskletScores]) -> VideoSummary:
    """Average per-object statistics over every object of a split (name → its :func:`score_masklet`)."""
    if not scores:
        raise ValueError("no objects to summarise")
    j_stats = {name: series_statistics(s.j) for name, s in scores.items()}
    f_stats = {name: series_statistics(s.f) for name, s in scores.items()}
    metrics = {}
    for prefix, stats in (("J", j_stats), ("F", f_stats)):
        metrics[f"{prefix}-Mean"] = float(np.mean([s.mean for s in stats.values()]))
        metrics[f"{prefix}-Recall"] = float(np.mean([s.recall for s in stats.values()]))
        metrics[f"{prefix}-Decay"] = float(np.mean([s.decay for s in stats.values()]))
    metrics = {"J&F-Mean": (metrics["J-Mean"] + metrics["F-Mean"]) / 2, **metrics}
    per_object = {name: {"J-Mean": j_stats[name].mean, "F-Mean": f_stats[name].mean} for name in scores}
    return VideoSummary(metrics=metrics, per_object=per_object)


VIDEO_JF_MEASURES = ("jf", "j")


@register_reward("video_jf")
class VideoJFReward:
    """Loop-1 reward on video: how well the partner's masklet matches the gt masklet over every frame, as the
    referring protocols score a clip (:func:`score_masklet`, all frames): ``measure='jf'`` gives J&F
    ((mean J + mean F) / 2), ``'j'`` mean J (per-frame IoU, an empty pair counting 1). A rollout whose masklet is
    None gets None; masklets are bool ``[T, H, W]`` (tensor or array)."""

    def __init__(self, name: str = "video_jf", weight: float = 1.0, measure: str = "jf",
                 bound_th: float = BOUNDARY_TOLERANCE) -> None:
        if measure not in VIDEO_JF_MEASURES:
            raise ValueError(f"reward {name!r}: measure={measure!r} is not one of {VIDEO_JF_MEASURES}")
        self.name, self.measure, self.bound_th = name, measure, bound_th
        self.weight = check_weight(name, weight)

    def __call__(self, inputs: RewardInputs) -> list[float | None]:
        preds = inputs.require("pred_masks", self.name)
        gts = inputs.require("gt_masks", self.name)
        values: list[float | None] = []
        for n, (pred, gt) in enumerate(zip(preds, gts)):
            if pred is None:
                values.append(None)
                continue
            pred, gt = (m.cpu().numpy() if torch.is_tensor(m) else np.asarray(m) for m in (pred, gt))
            try:
                scores = score_masklet(gt, pred, bound_th=self.bound_th)
            except ValueError as error:
                raise ValueError(f"reward {self.name!r}, sample {inputs.sample_ids[n]}: {error}") from None
            values.append(scores.j_and_f if self.measure == "jf" else float(np.mean(scores.j)))
        return values

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, weight={self.weight}, measure={self.measure!r})"
