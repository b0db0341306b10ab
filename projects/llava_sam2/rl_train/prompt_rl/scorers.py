"""GT-free quality scores of every (sample, prompt) pair of a ``QualityData``: the raw free baselines and the
reward network's predictions (calibration of the baselines happens in quality_model.py, on train pairs only).

Scorer names: ``iou_head`` (SAM2 IoU head), ``stability`` (SAM stability score), ``reward_net`` (network output,
already on the Dice scale).
"""
from __future__ import annotations

import numpy as np

from .metrics import stability_score
from .quality_data import QualityData
from .reward_net import RewardNet, make_inputs, predict_dice, resize_logits, resize_masks


def raw_free_scores(data: QualityData) -> dict[str, np.ndarray]:
    """Uncalibrated ``[I, K]`` scores of the free baselines."""
    return {"iou_head": data.pred_iou.astype(np.float64),
            "stability": stability_score(data.logits.astype(np.float32))}


def pred_mask_fractions(data: QualityData, side: int) -> np.ndarray:
    """Binary predicted masks (decoded from the cache's RLEs) area-resized to ``[I, K, R, R]``."""
    from pycocotools import mask as mask_utils

    masks = [mask_utils.decode({"size": r["size"], "counts": r["counts"].encode("ascii")})
             for per in data.meta["pred_rles"] for r in per]
    return resize_masks(masks, side).reshape(data.num_samples, data.num_prompts, side, side)


def network_inputs(data: QualityData, fractions: np.ndarray, mask_input: str, rows: np.ndarray):
    """Reward-network inputs ``[len(rows) * K, C, R, R]`` for the given samples (row-major over (sample, prompt))."""
    K, side = data.num_prompts, fractions.shape[-1]
    images = np.repeat(data.images[rows], K, axis=0)  # [n*K, R, R, 3]
    if images.shape[1] != side:
        raise ValueError(f"reward network side {side} != cached image side {images.shape[1]}; rebuild the cache with "
                         f"--image-side {side} or train the network with side {images.shape[1]}")
    masks = fractions[rows].reshape(-1, side, side)
    probs = None
    if mask_input == "binary+logits":
        probs = resize_logits(data.logits[rows].reshape(-1, *data.logits.shape[2:]), side)
    return make_inputs(images, masks, probs)


def network_scores(net: RewardNet, data: QualityData, fractions: np.ndarray) -> np.ndarray:
    """Predicted Dice ``[I, K]`` for every pair."""
    rows = np.arange(data.num_samples)
    x = network_inputs(data, fractions, net.config.mask_input, rows)
    return predict_dice(net, x).reshape(data.num_samples, data.num_prompts)
