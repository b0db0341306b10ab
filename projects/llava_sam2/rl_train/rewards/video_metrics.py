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

Computation: every per-frame quantity is a pixel count (|P ∩ G|, |P ∪ G|, the boundary sizes, the matched
boundary pixels), counted with torch on the predicted masks' device, many frames per call, and the float64
ratios are taken from those integer counts on the CPU. "Matched" is membership in the other boundary map dilated
by the disk of radius r (:func:`dilate_by_disk`), so the scores are exact, whatever the device.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .base import RewardInputs, check_weight, register_reward

BOUNDARY_TOLERANCE = 0.008  # matching distance as a fraction of the image diagonal
RECALL_THRESHOLD = 0.5  # a frame counts towards Recall when its score is above this
DECAY_QUARTERS = 4  # Decay compares the first and the last of this many time bins
# Pixels per counting chunk (whole frames, at least one). On the CPU a chunk's maps should stay in cache: 128 speckled
# frames of 896² px (r = 11) took 0.84 s in chunks of 2^20 pixels and 2.5 s in chunks of 2^24 (one thread). On an
# accelerator the bound is memory: about ten bool maps of the chunk's size are alive at once.
CPU_CHUNK_PIXELS = 2 ** 20
DEVICE_CHUNK_PIXELS = 2 ** 24


def _as_masks(masks, what: str) -> Tensor:
    tensor = masks if torch.is_tensor(masks) else torch.as_tensor(np.asarray(masks))
    if tensor.ndim not in (2, 3):
        raise ValueError(f"{what}: expected a mask [H, W] or a masklet [T, H, W], got shape {tuple(tensor.shape)}")
    return tensor.bool()


def _pair(gt_masks, pred_masks) -> tuple[Tensor, Tensor]:
    """Both as bool tensors on the predicted masks' device."""
    gt, pred = _as_masks(gt_masks, "gt_masks"), _as_masks(pred_masks, "pred_masks")
    if gt.shape != pred.shape:
        raise ValueError(f"gt_masks {tuple(gt.shape)} and pred_masks {tuple(pred.shape)} differ in shape")
    return gt.to(pred.device), pred


def boundary_map(masks) -> Tensor:
    """One-pixel-wide boundary of each mask (module doc): bool tensor of the input's shape ``[..., H, W]``."""
    mask = torch.as_tensor(masks).bool()
    edge = torch.zeros_like(mask)
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


def dilate_by_disk(maps: Tensor, radius: int) -> Tensor:
    """The pixels within ``radius`` (Euclidean) of a set pixel of the same map: the dilation of bool ``[F, H, W]``
    by :func:`tolerance_disk`, pixels outside the frame counting as unset.

    The disk is the union of its rows, the row at offset dy a run of half-width w(dy) (symmetric, so dy's sign does
    not matter). Growing one row-wise run per width (two shifted ORs per step) and ORing each row offset's run in
    takes about 4r whole-map boolean operations, with no arithmetic to round.
    """
    frames, height, width = maps.shape
    half_widths = (tolerance_disk(radius).sum(axis=1) - 1) // 2  # [2r + 1], row offset dy = index − r
    padded = maps.new_zeros((frames, height + 2 * radius, width + 2 * radius))
    padded[:, radius:radius + height, radius:radius + width] = maps
    runs = padded[:, :, radius:radius + width].clone()  # [F, H + 2r, W]: each padded row dilated by the current run
    dilated = torch.zeros_like(maps)
    for half_width in range(radius + 1):
        if half_width:
            runs |= padded[:, :, radius - half_width:radius - half_width + width]
            runs |= padded[:, :, radius + half_width:radius + half_width + width]
        for row in np.flatnonzero(half_widths == half_width).tolist():
            dilated |= runs[:, row:row + height]
    return dilated


# Reductions go through uint8 views of the bool maps: on the CPU, summing bytes into int32 is several times faster
# than count_nonzero, and amax than any.

def _count(maps: Tensor) -> Tensor:
    """Set pixels of each map ``[..., H, W]`` (int32: a frame has fewer than 2^31 pixels)."""
    return maps.view(torch.uint8).sum(dim=(-2, -1), dtype=torch.int32)


def _content_box(maps: Tensor) -> Tensor:
    """``maps`` ``[F, H, W]`` cropped to the smallest box that holds every set pixel of every frame (``[F, 0, 0]``
    when none is set). Dilating the crop misses nothing inside it, for no set pixel lies outside."""
    present = maps.view(torch.uint8).amax(dim=0)
    rows, cols = present.amax(dim=1).nonzero()[:, 0], present.amax(dim=0).nonzero()[:, 0]
    if len(rows) == 0:
        return maps[:, :0, :0]
    (top, bottom), (left, right) = rows[[0, -1]].tolist(), cols[[0, -1]].tolist()
    return maps[:, top:bottom + 1, left:right + 1]


def _masklet_counts(gt: Tensor, pred: Tensor, radius: int | None) -> Tensor:
    """Pixel counts of each frame of masklets bool ``[T, H, W]`` on one device, int64 ``[T, 2]``: |G ∩ P|, |G ∪ P|;
    with a ``radius``, ``[T, 6]``, adding the boundary sizes of G and P and how many of G's boundary pixels P's
    boundary matches and how many of P's G's does. Counted in chunks of whole frames (``*_CHUNK_PIXELS``)."""
    height, width = gt.shape[-2:]
    budget = CPU_CHUNK_PIXELS if gt.device.type == "cpu" else DEVICE_CHUNK_PIXELS
    step = max(1, budget // max(1, height * width))
    chunks = []
    for start in range(0, len(gt), step):
        g, p = gt[start:start + step], pred[start:start + step]
        counts = [_count(g & p), _count(g | p)]
        if radius is not None:
            edges = _content_box(boundary_map(torch.cat([g, p])))  # objects seldom fill the frame
            near = dilate_by_disk(edges, radius)
            g_edge, p_edge, near_g, near_p = edges[:len(g)], edges[len(g):], near[:len(g)], near[len(g):]
            counts += [_count(g_edge), _count(p_edge), _count(g_edge & near_p), _count(p_edge & near_g)]
        chunks.append(torch.stack(counts, dim=1))
    return torch.cat(chunks).long()


def _region_similarity(intersection: np.ndarray, union: np.ndarray) -> np.ndarray:
    """J of each frame from its pixel counts."""
    return np.where(union == 0, 1.0, intersection / np.maximum(union, 1))


def _boundary_f(n_gt: np.ndarray, n_pred: np.ndarray, matched_gt: np.ndarray, matched_pred: np.ndarray) -> np.ndarray:
    """F of each frame from its boundary pixel counts (module doc, including the empty-boundary cases)."""
    precision = matched_pred / np.maximum(n_pred, 1)
    recall = matched_gt / np.maximum(n_gt, 1)
    total = precision + recall
    f = np.divide(2 * precision * recall, total, out=np.zeros_like(total), where=total > 0)
    return np.where((n_gt == 0) | (n_pred == 0), (n_gt == n_pred).astype(np.float64), f)


def region_similarity(gt_masks, pred_masks) -> np.ndarray:
    """J of each frame: ``[T]`` for masklets ``[T, H, W]``, a 0-d array for masks ``[H, W]``."""
    gt, pred = _pair(gt_masks, pred_masks)
    counts = _masklet_counts(gt.reshape(-1, *gt.shape[-2:]), pred.reshape(-1, *gt.shape[-2:]), None).cpu().numpy()
    return _region_similarity(counts[:, 0], counts[:, 1]).reshape(gt.shape[:-2])


def boundary_measure(gt_masks, pred_masks, bound_th: float = BOUNDARY_TOLERANCE) -> np.ndarray:
    """F of each frame: ``[T]`` for masklets ``[T, H, W]``, a 0-d array for masks ``[H, W]``."""
    gt, pred = _pair(gt_masks, pred_masks)
    height, width = gt.shape[-2:]
    radius = boundary_tolerance_pixels(height, width, bound_th=bound_th)
    counts = _masklet_counts(gt.reshape(-1, height, width), pred.reshape(-1, height, width), radius).cpu().numpy()
    return _boundary_f(*counts[:, 2:].T).reshape(gt.shape[:-2])
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

    @classmethod
    def from_counts(cls, counts: np.ndarray) -> MaskletScores:
        """From a masklet's per-frame pixel counts ``[T, 6]`` (``_masklet_counts`` with a radius)."""
        return cls(j=_region_similarity(counts[:, 0], counts[:, 1]), f=_boundary_f(*counts[:, 2:].T))


def _masklet_pair(gt_masks, pred_masks) -> tuple[Tensor, Tensor]:
    gt, pred = _pair(gt_masks, pred_masks)
    if gt.ndim != 3:
        raise ValueError(f"expected masklets [T, H, W], got shape {tuple(gt.shape)}")
    return gt, pred


def _masklet_pairs(gt_masks, pred_masks, names: Sequence[str] | None) -> list[tuple[Tensor, Tensor]]:
    """Checked pairs of masklets with at least one frame, each gt on its prediction's device; a gt masklet that
    recurs (one object's G rollouts) moves there once. Errors name the pair (``names[n]``, default ``masklet n``)."""
    if len(gt_masks) != len(pred_masks):
        raise ValueError(f"{len(gt_masks)} gt masklets and {len(pred_masks)} predicted masklets")
    moved: dict[tuple[int, torch.device], tuple[object, Tensor]] = {}  # keeps each given gt alive: ids stay unique
    pairs = []
    for n, (gt, pred) in enumerate(zip(gt_masks, pred_masks)):
        try:
            pred = _as_masks(pred, "pred_masks")
            key = (id(gt), pred.device)
            if key not in moved:
                moved[key] = gt, _as_masks(gt, "gt_masks").to(pred.device)
            pairs.append(_masklet_pair(moved[key][1], pred))
            if len(pred) == 0:
                raise ValueError("expected at least one frame")
        except ValueError as error:
            raise ValueError(f"{f'masklet {n}' if names is None else names[n]}: {error}") from None
    return pairs


def score_masklet(gt_masks, pred_masks, *, semi_supervised: bool = False,
                  bound_th: float = BOUNDARY_TOLERANCE) -> MaskletScores:
    """J and F of each frame of one object, masklets bool ``[T, H, W]`` (tensors on any device, or arrays).

    ``semi_supervised=True`` scores frames 1 … T−2 as DAVIS's semi-supervised protocol does (T ≥ 3);
    otherwise every frame is scored, as the referring protocols do.
    """
    gt, pred = _masklet_pair(gt_masks, pred_masks)
    if semi_supervised:
        if len(gt) < 3:
            raise ValueError(f"semi_supervised scoring drops the first and last frame; needs T >= 3, got {len(gt)}")
        gt, pred = gt[1:-1], pred[1:-1]
    return score_masklets([gt], [pred], bound_th=bound_th, names=["masklet"])[0]


def score_masklets(gt_masks, pred_masks, *, bound_th: float = BOUNDARY_TOLERANCE,
                   names: Sequence[str] | None = None) -> list[MaskletScores]:
    """J and F of each frame of many objects, every frame scored: N gt and N predicted masklets bool ``[T, H, W]``
    (sequences of tensors or arrays, sizes free to differ between objects, or tensors ``[N, T, H, W]``).

    Each pair is counted on its predicted masklet's device and only the counts come back to the CPU. ``names``
    label the pairs in error messages (default ``masklet n``).
    """
    counts = [_masklet_counts(gt, pred, boundary_tolerance_pixels(*gt.shape[-2:], bound_th=bound_th))
              for gt, pred in _masklet_pairs(gt_masks, pred_masks, names)]
    return [MaskletScores.from_counts(c.cpu().numpy()) for c in counts]


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
        scored = [n for n, pred in enumerate(preds) if pred is not None]
        gts, preds = [gts[n] for n in scored], [preds[n] for n in scored]
        names = [f"reward {self.name!r}, sample {inputs.sample_ids[n]}" for n in scored]
        if self.measure == "jf":
            found = [s.j_and_f for s in score_masklets(gts, preds, bound_th=self.bound_th, names=names)]
        else:  # mean J needs no boundary
            found = [float(np.mean(region_similarity(gt, pred))) for gt, pred in _masklet_pairs(gts, preds, names)]
        values: list[float | None] = [None] * len(inputs)
        for n, value in zip(scored, found):
            values[n] = value
        return values

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, weight={self.weight}, measure={self.measure!r})"
