"""Mask metrics against pycocotools, the empty-mask convention, Sa2VA's cIoU/gIoU, mask rewards."""
import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils

from projects.llava_sam2.rl_train.rewards import (
    REWARDS,
    DiceReward,
    IoUReward,
    RewardInputs,
    SegmentationAccumulator,
    build_reward,
    ciou_giou,
    mask_metrics,
)


def _random_masks(n: int, h: int, w: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    density = rng.uniform(0.05, 0.7, size=(n, 1, 1))
    pred = rng.random((n, h, w)) < density
    gt = rng.random((n, h, w)) < density[::-1]
    return pred, gt


def test_iou_and_dice_agree_with_pycocotools():
    pred, gt = _random_masks(12, 23, 31, seed=0)
    metrics = mask_metrics(torch.from_numpy(pred), torch.from_numpy(gt))
    for i in range(len(pred)):
        p_rle = mask_utils.encode(np.asfortranarray(pred[i].astype(np.uint8)))
        g_rle = mask_utils.encode(np.asfortranarray(gt[i].astype(np.uint8)))
        iou = mask_utils.iou([p_rle], [g_rle], [0])[0, 0]
        inter = mask_utils.area(mask_utils.merge([p_rle, g_rle], intersect=True))
        dice = 2 * inter / (mask_utils.area(p_rle) + mask_utils.area(g_rle))
        assert metrics["iou"][i].item() == pytest.approx(iou, abs=1e-12)
        assert metrics["dice"][i].item() == pytest.approx(dice, abs=1e-12)
        assert metrics["precision"][i].item() == pytest.approx(inter / mask_utils.area(p_rle), abs=1e-12)
        assert metrics["recall"][i].item() == pytest.approx(inter / mask_utils.area(g_rle), abs=1e-12)


def test_empty_mask_convention():
    empty = torch.zeros(4, 4, dtype=torch.bool)
    full = torch.ones(4, 4, dtype=torch.bool)
    both_empty = mask_metrics(empty, empty)
    assert {k: v.item() for k, v in both_empty.items()} == {"iou": 1.0, "dice": 1.0, "precision": 1.0, "recall": 1.0}
    empty_pred = mask_metrics(empty, full)
    assert {k: v.item() for k, v in empty_pred.items()} == {"iou": 0.0, "dice": 0.0, "precision": 0.0, "recall": 0.0}
    empty_gt = mask_metrics(full, empty)
    assert {k: v.item() for k, v in empty_gt.items()} == {"iou": 0.0, "dice": 0.0, "precision": 0.0, "recall": 0.0}


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="resize the prediction"):
        mask_metrics(torch.zeros(2, 4, 4), torch.zeros(2, 4, 5))


def test_ciou_giou_hand_computed():
    # pair 1: |P∩G| = 2, |P∪G| = 4 (IoU 0.5); pair 2: I = 3, U = 3 (IoU 1); pair 3: both empty (IoU 1).
    p1 = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    g1 = torch.tensor([[0, 1, 1, 1]], dtype=torch.bool)
    p2 = torch.ones(1, 3, dtype=torch.bool)
    p3 = torch.zeros(2, 2, dtype=torch.bool)
    out = ciou_giou([p1, p2, p3], [g1, p2.clone(), p3.clone()])
    assert out["cIoU"] == pytest.approx(5 / 7, abs=1e-9)  # ΣI / ΣU = (2 + 3 + 0) / (4 + 3 + 0)
    assert out["gIoU"] == pytest.approx((0.5 + 1.0 + 1.0) / 3, abs=1e-5)  # upstream's 1e-5 epsilon
    assert out["count"] == 3


def test_accumulator_counts_missing_prediction_as_empty():
    acc = SegmentationAccumulator()
    acc.update(None, torch.ones(1, 2, 2, dtype=torch.bool))
    assert acc.compute() == {"cIoU": 0.0, "gIoU": 0.0, "count": 1.0}
    with pytest.raises(ValueError, match="before any update"):
        SegmentationAccumulator().compute()


def test_iou_reward_lists_of_sizes_and_none():
    a = torch.tensor([[1, 1], [0, 0]], dtype=torch.bool)
    b = torch.tensor([[1, 0], [0, 0]], dtype=torch.bool)
    big = np.ones((3, 5), dtype=bool)
    inputs = RewardInputs(sample_ids=["s#0", "s#1", "s#2"], pred_masks=[a, big, None], gt_masks=[b, big, b])
    assert IoUReward()(inputs) == [0.5, 1.0, None]
    assert DiceReward(weight=0.5)(inputs) == [pytest.approx(2 / 3), 1.0, None]
    batched = RewardInputs(sample_ids=["x", "y"], pred_masks=torch.stack([a, b]), gt_masks=torch.stack([b, b]))
    assert build_reward({"type": "iou"})(batched) == [0.5, 1.0]
    assert set(REWARDS) >= {"iou", "dice", "meteor", "dlc_judge"}


def test_reward_inputs_validation_names_the_field():
    with pytest.raises(ValueError, match="pred_captions has 1 entries but sample_ids has 2"):
        RewardInputs(sample_ids=["a", "b"], pred_captions=["x"])
    with pytest.raises(ValueError, match="needs RewardInputs.pred_masks"):
        IoUReward()(RewardInputs(sample_ids=["a"]))
    with pytest.raises(ValueError, match="weight must be a finite number"):
        IoUReward(weight=float("inf"))
    assert IoUReward(weight=-1).weight == -1.0  # negative weights penalise (TRL semantics)
    with pytest.raises(ValueError, match="unknown reward type 'nope'"):
        build_reward({"type": "nope"})
