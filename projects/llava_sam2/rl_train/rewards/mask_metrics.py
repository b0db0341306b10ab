"""Mask agreement metrics on batched pixel masks, Sa2VA's cIoU / gIoU aggregators, and mask rewards.

With P the predicted and G the ground-truth pixel set of one mask pair::

    IoU = |P ∩ G| / |P ∪ G|        Dice = 2 |P ∩ G| / (|P| + |G|)
    precision = |P ∩ G| / |P|      recall = |P ∩ G| / |G|

Empty-mask convention (per pair): when both masks are empty every metric is 1.0 (the two agree
that there is nothing). When exactly one is empty IoU and Dice are 0.0, and so is the ratio whose
denominator is empty (precision of an empty prediction against a non-empty target, recall of a
non-empty prediction against an empty target), as with scikit-learn's ``zero_division=0``.

Aggregators over a split, as Sa2VA's ``RES.evaluate`` defines them (foreground class only)::

    cIoU = Σ_i |P_i ∩ G_i| / (Σ_i |P_i ∪ G_i| + 1e-10)
    gIoU = mean_i IoU_i, with IoU_i = |P_i ∩ G_i| / (|P_i ∪ G_i| + 1e-5), and 1.0 where the union is empty

The epsilons are upstream's; per-rollout rewards use the exact ratio.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .base import RewardInputs, check_weight, register_reward

CIOU_EPS = 1e-10  # Sa2VA RES.evaluate: intersection / (union + 1e-10)
GIOU_EPS = 1e-5  # Sa2VA RES.evaluate: per-object intersect / (union + 1e-5), +1 where union == 0


def _as_bool_tensor(masks: Any, what: str) -> torch.Tensor:
    """Masks (tensor/array, or a list of ``[H, W]``) -> bool tensor ``[N, H, W]``."""
    if isinstance(masks, (list, tuple)):
        masks = torch.stack([torch.as_tensor(np.asarray(m) if not torch.is_tensor(m) else m) for m in masks])
    tensor = torch.as_tensor(masks)
    if tensor.dim() == 2:
        tensor = tensor.unsqueeze(0)  # [H, W] -> [1, H, W]
    if tensor.dim() != 3:
        raise ValueError(f"{what} must be [N, H, W] or [H, W], got shape {tuple(tensor.shape)}")
    return tensor.bool() if tensor.dtype == torch.bool else tensor > 0


def mask_counts(pred_mask: Any, gt_mask: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pixel counts per pair: (|P ∩ G|, |P|, |G|), each float64 ``[N]``.

    Args:
        pred_mask: bool ``[N, H, W]`` (or ``[H, W]``); non-bool values count as True where > 0.
        gt_mask: same shape as ``pred_mask``.
    """
    pred = _as_bool_tensor(pred_mask, "pred_mask")
    gt = _as_bool_tensor(gt_mask, "gt_mask").to(pred.device)
    if pred.shape != gt.shape:
        raise ValueError(
            f"pred_mask shape {tuple(pred.shape)} != gt_mask shape {tuple(gt.shape)}; "
            "resize the prediction to the ground-truth size first"
        )
    inter = (pred & gt).flatten(1).sum(1).double()  # [N]
    pred_area = pred.flatten(1).sum(1).double()  # [N]
    gt_area = gt.flatten(1).sum(1).double()  # [N]
    return inter, pred_area, gt_area


def _ratio(num: torch.Tensor, den: torch.Tensor, both_empty: torch.Tensor) -> torch.Tensor:
    """num / den with 0 where den == 0, then 1 where both masks are empty."""
    out = torch.where(den > 0, num / den.clamp_min(1), torch.zeros_like(num))
    return torch.where(both_empty, torch.ones_like(out), out)


def mask_metrics(pred_mask: Any, gt_mask: Any) -> dict[str, torch.Tensor]:
    """IoU, Dice, precision and recall per pair, each float64 ``[N]`` (conventions in the module doc)."""
    inter, pred_area, gt_area = mask_counts(pred_mask, gt_mask)
    union = pred_area + gt_area - inter
    both_empty = union == 0
    return {
        "iou": _ratio(inter, union, both_empty),
        "dice": _ratio(2 * inter, pred_area + gt_area, both_empty),
        "precision": _ratio(inter, pred_area, both_empty),
        "recall": _ratio(inter, gt_area, both_empty),
    }


def mask_iou(pred_mask: Any, gt_mask: Any) -> torch.Tensor:
    """IoU per pair, float64 ``[N]``."""
    return mask_metrics(pred_mask, gt_mask)["iou"]


def mask_dice(pred_mask: Any, gt_mask: Any) -> torch.Tensor:
    """Dice per pair, float64 ``[N]``."""
    return mask_metrics(pred_mask, gt_mask)["dice"]


def mask_precision(pred_mask: Any, gt_mask: Any) -> torch.Tensor:
    """Precision per pair, float64 ``[N]``."""
    return mask_metrics(pred_mask, gt_mask)["precision"]


def mask_recall(pred_mask: Any, gt_mask: Any) -> torch.Tensor:
    """Recall per pair, float64 ``[N]``."""
    return mask_metrics(pred_mask, gt_mask)["recall"]


class SegmentationAccumulator:
    """Running cIoU / gIoU over a split, as Sa2VA's ``RES.evaluate`` (see module doc).

    ``update`` takes one batch of pairs; a missing prediction (``None``) counts as an empty mask,
    as upstream does.
    """

    def __init__(self) -> None:
        self.intersection = 0.0
        self.union = 0.0
        self.giou_sum = 0.0
        self.count = 0

    def update(self, pred_mask: Any, gt_mask: Any) -> None:
        gt = _as_bool_tensor(gt_mask, "gt_mask")
        pred = torch.zeros_like(gt) if pred_mask is None else pred_mask
        inter, pred_area, gt_area = mask_counts(pred, gt)
        union = pred_area + gt_area - inter
        iou = inter / (union + GIOU_EPS)
        iou = torch.where(union == 0, iou + 1.0, iou)  # upstream adds 1 where the union is empty
        self.intersection += float(inter.sum())
        self.union += float(union.sum())
        self.giou_sum += float(iou.sum())
        self.count += int(inter.numel())

    def compute(self) -> dict[str, float]:
        """``{"cIoU", "gIoU", "count"}``; raises when nothing was added."""
        if self.count == 0:
            raise ValueError("SegmentationAccumulator.compute called before any update")
        return {
            "cIoU": self.intersection / (self.union + CIOU_EPS),
            "gIoU": self.giou_sum / self.count,
            "count": float(self.count),
        }


def ciou_giou(pred_masks: Sequence[Any], gt_masks: Sequence[Any]) -> dict[str, float]:
    """cIoU and gIoU of a list of mask pairs (masks may differ in size between pairs)."""
    accumulator = SegmentationAccumulator()
    for pred, gt in zip(pred_masks, gt_masks, strict=True):
        accumulator.update(pred, gt)
    return accumulator.compute()


def _per_rollout_metric(inputs: RewardInputs, reward_name: str, metric: str) -> list[float | None]:
    """One metric per rollout; a rollout whose predicted mask is ``None`` gets ``None``."""
    preds = inputs.require("pred_masks", reward_name)
    gts = inputs.require("gt_masks", reward_name)
    if torch.is_tensor(preds) and torch.is_tensor(gts) and preds.shape == gts.shape:
        return [float(v) for v in mask_metrics(preds, gts)[metric]]
    values: list[float | None] = []
    for i, (pred, gt) in enumerate(zip(preds, gts)):
        if pred is None:
            values.append(None)
            continue
        if np.ndim(pred) == 3 and len(pred) > 1:  # one rollout's masklet [T, H, W]: a per-pair metric would keep frame 0
            raise ValueError(f"reward {reward_name!r}, sample {inputs.sample_ids[i]}: got a masklet of "
                             f"{len(pred)} frames; score video rollouts with the 'video_jf' reward "
                             "(measure='j' is the per-frame IoU averaged over the clip).")
        try:
            values.append(float(mask_metrics(pred, gt)[metric][0]))
        except ValueError as error:
            raise ValueError(f"reward {reward_name!r}, sample {inputs.sample_ids[i]}: {error}") from None
    return values


@register_reward("iou")
class IoUReward:
    """Loop-1 reward: IoU(gt_mask, pred_mask) per rollout."""

    metric = "iou"

    def __init__(self, name: str = "iou", weight: float = 1.0) -> None:
        self.name = name
        self.weight = check_weight(name, weight)

    def __call__(self, inputs: RewardInputs) -> list[float | None]:
        return _per_rollout_metric(inputs, self.name, self.metric)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, weight={self.weight})"


@register_reward("dice")
class DiceReward(IoUReward):
    """Dice(gt_mask, pred_mask) per rollout."""

    metric = "dice"

    def __init__(self, name: str = "dice", weight: float = 1.0) -> None:
        super().__init__(name=name, weight=weight)
