"""model/pipeline/region_chain.py: the released mask chain at the partner's region sample points (the ``region`` mask action),
checked against the processor's own ``region_cells`` and an fp64 evaluation of the chain."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.pipeline.region_chain import (
    MaskChain, cells_to_masks, region_logits, region_sample_points)
from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

# (H, W): square, non-square, sides that g = 8 does not divide, H = g exactly
SIZES = [(64, 64), (20, 28), (37, 61), (8, 13), (100, 9)]


@functools.lru_cache(maxsize=1)
def processor():
    """The tiny preset's processor: region grid g = 224 / 14 * 0.5 = 8."""
    tokenizer = load_tiny_tokenizer()
    return Sa2VAProcessor.from_config(tokenizer, build_preset("tiny", vocab_size=len(tokenizer)), empty_region="keep")


def cells_of(mask):
    return processor().region_cells(mask, empty_region="keep")


def chain_fp64(low_res, size, sam_image_size):
    """Reference: bilinear h -> S -> (H, W) in fp64, as ``grounding.logits_to_masks`` before its threshold."""
    up = F.interpolate(low_res.double()[None, None], size=(sam_image_size,) * 2, mode="bilinear", align_corners=False)
    return F.interpolate(up, size=size, mode="bilinear", align_corners=False)[0, 0]  # [H, W]


@pytest.mark.parametrize("size", SIZES)
def test_sample_points_are_the_pixels_region_cells_reads(size):
    # a mask that is True exactly at sample point (p_r, q_c) has region cells exactly {(r, c)}; the complement of all
    # sample points has no region cell at all
    g = processor().region_grid_size
    rows, cols = region_sample_points(size[0], g), region_sample_points(size[1], g)
    for r, c in [(0, 0), (g - 1, g - 1), (3, 5)]:
        mask = torch.zeros(size, dtype=torch.bool)
        mask[rows[r], cols[c]] = True
        expected = torch.zeros(g, g, dtype=torch.bool)
        expected[r, c] = True
        assert torch.equal(cells_of(mask), expected)
    holes = torch.ones(size, dtype=torch.bool)
    holes[rows[:, None], cols[None, :]] = False
    assert not cells_of(holes).any()


@pytest.mark.parametrize("size", SIZES)
def test_painted_cells_round_trip_through_region_cells(size):
    g = processor().region_grid_size
    generator = torch.Generator().manual_seed(sum(size))
    cells = torch.rand(3, g, g, generator=generator) < 0.5
    masks = cells_to_masks(cells, [size] * 3)
    for mask, grid in zip(masks, cells):
        assert mask.shape == size and mask.dtype == torch.bool
        assert torch.equal(cells_of(mask), grid)


def test_every_cell_can_change_the_partner_input():
    # share 1.0 by construction: flipping any one cell changes exactly that cell of what the partner reads
    g, size = processor().region_grid_size, (37, 61)
    cells = torch.rand(g, g, generator=torch.Generator().manual_seed(0)) < 0.5
    for r in range(g):
        for c in range(g):
            flipped = cells.clone()
            flipped[r, c] = ~flipped[r, c]
            changed = cells_of(cells_to_masks(flipped[None], [size])[0]) ^ cells
            assert changed.sum() == 1 and changed[r, c], (r, c)


def test_plain_nearest_upsampling_would_not_round_trip():
    # why cells_to_masks paints spans [p_r, p_{r+1}): nearest upsampling of the cells to 20 px misplaces a cell
    cells = torch.zeros(1, 8, 8, dtype=torch.bool)
    cells[0, 1, :] = True  # row 1 only
    nearest = F.interpolate(cells.float()[None], size=(20, 20), mode="nearest")[0, 0] > 0
    assert not torch.equal(cells_of(nearest), cells[0])
    assert torch.equal(cells_of(cells_to_masks(cells, [(20, 20)])[0]), cells[0])


@pytest.mark.parametrize("h, sam, g, size", [(64, 256, 8, (64, 64)), (64, 256, 8, (37, 61)),
                                             (256, 1024, 16, (448, 448)), (256, 1024, 16, (480, 640))])
def test_region_logits_equal_the_fp64_chain_at_the_sample_points(h, sam, g, size):
    low_res = torch.randn(2, h, h, generator=torch.Generator().manual_seed(h + size[1]))
    got = region_logits(low_res, [size, size], sam, g)  # [2, g, g] fp32
    assert got.shape == (2, g, g) and got.dtype == torch.float32
    rows, cols = region_sample_points(size[0], g), region_sample_points(size[1], g)
    for z, value in zip(low_res, got):
        expected = chain_fp64(z, size, sam)[rows][:, cols]
        torch.testing.assert_close(value.double(), expected, rtol=0, atol=2e-5)


def test_region_logits_carry_grad_only_to_pixels_the_chain_reads():
    low_res = torch.randn(1, 64, 64, requires_grad=True)
    region_logits(low_res, [(64, 64)], 256, 8).sum().backward()
    reached = low_res.grad[0].abs() > 0  # [64, 64]
    assert 0 < reached.float().mean() < 0.5  # 8 sample rows touch 2 low-res rows each


def test_mask_chain_rows_and_size_errors():
    chain = MaskChain(sizes=((20, 28), (20, 28), (30, 30), (30, 30)), sam_image_size=32, grid_size=4)
    assert chain.every(2).sizes == ((20, 28), (30, 30))
    assert [m.shape for m in chain.to_masks(torch.randn(4, 8, 8))] == [(20, 28), (20, 28), (30, 30), (30, 30)]
    with pytest.raises(ValueError, match=r"image size \(H, W\) = \(3, 28\)"):
        cells_to_masks(torch.ones(1, 4, 4, dtype=torch.bool), [(3, 28)])
    with pytest.raises(ValueError, match="2 logit maps but 1 image sizes"):
        region_logits(torch.zeros(2, 8, 8), [(20, 20)], 32, 4)
