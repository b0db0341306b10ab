"""The upstream Sa2VA SFT loss as plain functions (reference/sa2va.md §7.1).

``total = llm_loss + loss_mask + loss_dice``:

* ``llm_loss``: token cross-entropy, mean over supervised tokens (``labels != -100``).
* ``loss_mask``: 2.0 · Σ BCE-with-logits over sampled points / (M · P + 1e-4).
* ``loss_dice``: 0.5 · Σ_m [1 − (2 Σ p·t + 1) / (Σ p + Σ t + 1)] / (M + 1e-4), p = sigmoid.

Points are PointRend importance samples (Kirillov et al. 2020, §3.1) on the low-res mask logits:
draw ``oversample_ratio · P`` uniform points, keep the ``importance_sample_ratio · P`` most
uncertain (uncertainty = −|logit|), add fresh uniform points up to P, then bilinear-sample the
logits and the nearest-resized GT there (``grid_sample``, ``align_corners=False``). The ``+1e-4`` in
the denominators is upstream's ``avg_factor``. M = masks, P = points per mask, h×w = low-res size.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .constants import IGNORE_INDEX

LOSS_MASK_WEIGHT = 2.0
LOSS_DICE_WEIGHT = 0.5
NUM_POINTS = 12544  # upstream value for 256x256 logits (= 112²)


def point_sample(values: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """Bilinear samples of ``values [M, h, w]`` at ``coords [M, P, 2]`` (x, y in [0, 1]) → ``[M, P]``."""
    grid = (2.0 * coords - 1.0)[:, :, None]  # [M, P, 1, 2] in [-1, 1]
    sampled = F.grid_sample(values[:, None].float(), grid.float(), align_corners=False)  # [M, 1, P, 1]
    return sampled[:, 0, :, 0]  # [M, P]


@torch.no_grad()
def sample_uncertain_points(
    logits: torch.Tensor,
    num_points: int,
    oversample_ratio: float = 3.0,
    importance_sample_ratio: float = 0.75,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """PointRend training points for mask logits ``[M, h, w]`` → coords ``[M, P, 2]`` in [0, 1].

    ``int(P · oversample_ratio)`` uniform candidates; the ``int(importance_sample_ratio · P)`` with
    the largest −|logit| (bilinear at the candidate) are kept; the rest are fresh uniform points.
    """
    if num_points < 1 or oversample_ratio < 1 or not 0 <= importance_sample_ratio <= 1:
        raise ValueError(
            f"sample_uncertain_points: need num_points >= 1, oversample_ratio >= 1, 0 <= "
            f"importance_sample_ratio <= 1; got {num_points}, {oversample_ratio}, {importance_sample_ratio}."
        )
    M = logits.shape[0]
    kw = dict(device=logits.device, generator=generator)
    candidates = torch.rand(M, int(num_points * oversample_ratio), 2, **kw)  # [M, P·r, 2]
    uncertainty = -point_sample(logits, candidates).abs()  # [M, P·r]
    num_uncertain = int(importance_sample_ratio * num_points)
    top = uncertainty.topk(num_uncertain, dim=1).indices  # [M, P_u]
    uncertain = candidates.gather(1, top[..., None].expand(-1, -1, 2))  # [M, P_u, 2]
    fresh = torch.rand(M, num_points - num_uncertain, 2, **kw)  # [M, P - P_u, 2]
    return torch.cat([uncertain, fresh], dim=1)  # [M, P, 2]


def mask_bce_loss(point_logits: torch.Tensor, point_targets: torch.Tensor,
                  weight: float = LOSS_MASK_WEIGHT) -> torch.Tensor:
    """``weight · Σ BCE_with_logits(x, t) / (M · P + 1e-4)`` over ``[M, P]`` point values."""
    M, P = point_logits.shape
    bce = F.binary_cross_entropy_with_logits(point_logits, point_targets, reduction="sum")
    return weight * bce / (M * P + 1e-4)


def mask_dice_loss(point_logits: torch.Tensor, point_targets: torch.Tensor,
                   weight: float = LOSS_DICE_WEIGHT, eps: float = 1.0) -> torch.Tensor:
    """``weight · Σ_m [1 − (2 Σ p t + eps) / (Σ p + Σ t + eps)] / (M + 1e-4)``, p = sigmoid(x) (naive Dice)."""
    M = point_logits.shape[0]
    p = point_logits.sigmoid()  # [M, P]
    dice = (2 * (p * point_targets).sum(-1) + eps) / (p.sum(-1) + point_targets.sum(-1) + eps)  # [M]
    return weight * (1 - dice).sum() / (M + 1e-4)


def resize_gt_masks(gt_masks: list[torch.Tensor], size: tuple[int, int]) -> torch.Tensor:
    """Nearest-resize each ``[n_i, H_i, W_i]`` GT stack to the low-res logits size → ``[Σ n_i, h, w]`` float."""
    resized = [F.interpolate(m[None].float(), size=size, mode="nearest")[0] for m in gt_masks]  # [n_i, h, w]
    return torch.cat(resized, dim=0)


def mask_losses(
    pred_logits: torch.Tensor,
    gt_mask: torch.Tensor,
    *,
    num_points: int = NUM_POINTS,
    oversample_ratio: float = 3.0,
    importance_sample_ratio: float = 0.75,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss_mask, loss_dice)`` of low-res logits ``[M, h, w]`` against GT ``[M, h, w]`` (0/1, same size)."""
    if pred_logits.shape != gt_mask.shape:
        raise ValueError(
            f"mask_losses: predicted logits {tuple(pred_logits.shape)} and GT masks {tuple(gt_mask.shape)} "
            "differ; resize the GT to the logits size first (resize_gt_masks)."
        )
    coords = sample_uncertain_points(pred_logits.detach(), num_points, oversample_ratio,
                                     importance_sample_ratio, generator)  # [M, P, 2]
    point_targets = point_sample(gt_mask.float(), coords)  # [M, P]
    point_logits = point_sample(pred_logits, coords)  # [M, P]
    return mask_bce_loss(point_logits, point_targets), mask_dice_loss(point_logits, point_targets)


def llm_loss(logits_fn, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy over supervised positions; hidden ``[B, L, D]``, labels ``[B, L]``.

    Position i predicts label i+1; ``logits_fn`` (the LM head) runs only where that label is
    supervised, so no ``[B, L, V]`` logits tensor is built.
    """
    target = labels[:, 1:]  # [B, L-1]
    is_supervised = target != IGNORE_INDEX  # [B, L-1]
    if not bool(is_supervised.any()):
        raise ValueError("sft_loss: the batch has no supervised token (every label is -100).")
    logits = logits_fn(hidden[:, :-1][is_supervised]).float()  # [S, V]
    return F.cross_entropy(logits, target[is_supervised])
