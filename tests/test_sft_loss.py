"""model/sft_loss.py: point sampling and loss formulas on tensors, then the full loss on the tiny model."""
import math

import pytest
import torch
import torch.nn.functional as F

from projects.llava_sam2.rl_train.model.sft_loss import (
    llm_loss, mask_bce_loss, mask_dice_loss, mask_losses, point_sample, resize_gt_masks,
    sample_uncertain_points)


def test_point_sample_hits_pixel_centres():
    values = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])  # [1, 2, 2]
    # align_corners=False: pixel (row i, col j) has its centre at x=(j+0.5)/w, y=(i+0.5)/h
    coords = torch.tensor([[[0.25, 0.25], [0.75, 0.25], [0.25, 0.75], [0.75, 0.75], [0.5, 0.25]]])
    assert point_sample(values, coords).tolist() == [[1.0, 2.0, 3.0, 4.0, 1.5]]


def test_uncertain_points_are_the_top_candidates_plus_fresh_ones():
    logits = torch.randn(2, 8, 8) * 4
    P, ratio = 20, 3.0
    coords = sample_uncertain_points(logits, P, ratio, 0.75, torch.Generator().manual_seed(0))
    assert coords.shape == (2, P, 2) and coords.min() >= 0 and coords.max() <= 1
    candidates = torch.rand(2, int(P * ratio), 2, generator=torch.Generator().manual_seed(0))  # same draw
    uncertainty = -point_sample(logits, candidates).abs()  # [2, 60]
    n_unc = int(0.75 * P)  # 15 importance points, 5 fresh uniform ones
    for m in range(2):
        expected = candidates[m, uncertainty[m].topk(n_unc).indices]
        assert torch.equal(coords[m, :n_unc], expected)
        fresh_in_candidates = (coords[m, n_unc:, None] == candidates[m][None]).all(-1).any(-1)
        assert not fresh_in_candidates.any()


def test_uncertain_points_concentrate_on_the_decision_boundary():
    logits = torch.full((1, 32, 32), 20.0)
    logits[:, :, :8] = 0.0  # only the left quarter is uncertain
    coords = sample_uncertain_points(logits, 400, 3.0, 0.75, torch.Generator().manual_seed(1))
    assert (coords[0, :300, 0] < 0.25 + 1 / 64).float().mean() > 0.95  # importance part
    assert (coords[0, 300:, 0] > 0.3).any()  # the uniform part still covers the rest


def test_bce_and_dice_worked_example():
    x = torch.tensor([[0.0, 0.0]])  # p = sigmoid(0) = 0.5 at both points
    t = torch.tensor([[1.0, 0.0]])
    # BCE = ln 2 per point; Σ = 2 ln 2; / (M·P + 1e-4) = / 2.0001; × 2.0
    assert mask_bce_loss(x, t).item() == pytest.approx(2.0 * 2 * math.log(2) / 2.0001, rel=1e-6)
    # Σpt = 0.5, Σp = 1, Σt = 1 → dice = (2·0.5 + 1) / (1 + 1 + 1) = 2/3; loss = 0.5 · (1/3) / 1.0001
    assert mask_dice_loss(x, t).item() == pytest.approx(0.5 * (1 / 3) / 1.0001, rel=1e-6)


def test_resize_gt_masks_is_nearest_top_left_sampling():
    gt = torch.zeros(1, 4, 4, dtype=torch.uint8)
    gt[0, 0, 0] = 1  # top-left pixel of the top-left 2x2 block
    gt[0, 3, 3] = 1  # bottom-right pixel of the bottom-right block: not sampled by nearest
    other = torch.ones(2, 6, 6, dtype=torch.uint8)
    out = resize_gt_masks([gt, other], (2, 2))
    assert out.shape == (3, 2, 2) and out.dtype == torch.float32
    assert out[0].tolist() == [[1.0, 0.0], [0.0, 0.0]] and bool((out[1:] == 1).all())


def test_mask_losses_rank_predictions_and_reach_the_logits():
    gt = torch.zeros(2, 16, 16)
    gt[0, 4:12, 4:12] = 1
    gt[1, :, :5] = 1
    good = ((gt * 2 - 1) * 12).requires_grad_(True)
    bad = -good.detach()
    kw = dict(num_points=64, generator=torch.Generator().manual_seed(0))
    good_mask, good_dice = mask_losses(good, gt, **kw)
    bad_mask, bad_dice = mask_losses(bad, gt, **kw)
    # importance points sit on the boundary, where bilinear logits are ~0, so "good" is not ~0
    assert good_mask * 5 < bad_mask and good_dice * 5 < bad_dice
    (good_mask + good_dice).backward()
    assert good.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="resize the GT"):
        mask_losses(good, gt[:, :8], **kw)


def test_llm_loss_equals_shifted_cross_entropy_with_ignore_index():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11)
    hidden = torch.randn(2, 5, 8)
    labels = torch.tensor([[-100, -100, 3, 4, -100], [-100, 7, 1, -100, -100]])
    reference = F.cross_entropy(head(hidden)[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(llm_loss(head, hidden, labels), reference)
    with pytest.raises(ValueError, match="no supervised token"):
        llm_loss(head, hidden, torch.full_like(labels, -100))
