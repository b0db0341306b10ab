"""The released mask chain at the partner's region sample points, and back (the ``region`` mask action).

A ``[SEG]`` mask reaches a describing model only through its region cells: the low-res decoder logits ``z [h, w]``
go through the released chain (``grounding.logits_to_masks``: bilinear h -> S_sam, bilinear S_sam -> (H, W),
``> 0``) and ``Sa2VAProcessor.region_cells`` keeps the g x g pixels ``(p_r, q_c)`` picked by nearest sampling
(``p_r = floor(r H / g)``, computed by ``F.interpolate(mode='nearest')`` exactly as the processor does). Both
bilinear steps are linear and separable, so the chain's value at those points is

    Z[r, c] = sum_{i, j} A_y[r, i] z[i, j] A_x[c, j]        A_y = (S_sam -> H)[p_r, :] @ (h -> S_sam)  [g, h]

with the 1-D interpolation matrices read off ``F.interpolate`` applied to an identity (the same kernel as the
chain, so Z equals the upsampled logits at the sample points up to float summation order; tested). ``Z > 0`` are the
cells the greedy mask would give the partner.

Back: :func:`cells_to_masks` paints cell (r, c) over rows ``[p_r, p_{r+1})`` and columns ``[q_c, q_{c+1})`` (the
pixels whose nearest sample point at or above-left is that cell's), so ``region_cells(cells_to_masks(m)) == m``
exactly, for any image size with H, W >= g. Plain nearest upsampling does not round-trip when g does not divide
the side (H = 20, g = 8: the sample row p_1 = 2 is painted from cell floor(2 * 8 / 20) = 0).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..network.grounding import logits_to_masks


@functools.lru_cache(maxsize=64)
def region_sample_points(length: int, grid_size: int) -> Tensor:
    """long ``[g]``: the pixel index along one image side that region cell r samples (``region_cells``' rule)."""
    index = torch.arange(length, dtype=torch.float64).view(1, 1, length, 1)  # [1, 1, L, 1]
    picked = F.interpolate(index, size=(grid_size, 1), mode="nearest")  # [1, 1, g, 1], as region_cells
    return picked.view(grid_size).long()


def _linear_matrix(size_in: int, size_out: int) -> Tensor:
    """float64 ``[size_out, size_in]``: one axis of ``F.interpolate(mode='bilinear', align_corners=False)``."""
    eye = torch.eye(size_in, dtype=torch.float64).view(1, size_in, size_in, 1)  # channel i = impulse at row i
    response = F.interpolate(eye, size=(size_out, 1), mode="bilinear", align_corners=False)  # [1, in, out, 1]
    return response[0, :, :, 0].T  # [out, in]


@functools.lru_cache(maxsize=64)
def chain_rows(low_res: int, sam_image_size: int, length: int, grid_size: int) -> Tensor:
    """float64 ``[g, h]``: the chain h -> S_sam -> L along one axis, evaluated at the g region sample points."""
    to_sam = _linear_matrix(low_res, sam_image_size)  # [S, h]
    points = region_sample_points(length, grid_size)  # [g]
    to_image = _linear_matrix(sam_image_size, length)[points]  # [g, S]
    return to_image @ to_sam  # [g, h]


def _check_size(size: tuple[int, int], grid_size: int) -> None:
    if min(size) < grid_size:
        raise ValueError(f"region mask action: image size (H, W) = {tuple(size)} is smaller than the region grid "
                         f"g = {grid_size} on a side, so region sample points repeat and a cell grid cannot be "
                         "shown to the partner exactly; resize such images up or use mask_policy='bernoulli'.")


def region_logits(low_res_logits: Tensor, sizes: Sequence[tuple[int, int]], sam_image_size: int,
                  grid_size: int) -> Tensor:
    """fp32 ``[M, g, g]``: ``low_res_logits [M, h, w]`` through the released chain at the region sample points.

    Carries grad (a linear map of the logits). ``sizes``: M image sizes (H, W). Autocast is off here: under the
    training configs' bf16 autocast the two matmuls would round every cell logit to bf16 (~1e-2), the error the
    mask action's fp32 log-probs exist to avoid.
    """
    M, h, w = low_res_logits.shape
    if len(sizes) != M:
        raise ValueError(f"region_logits got {M} logit maps but {len(sizes)} image sizes")
    z = low_res_logits.float()
    for size in sizes:
        _check_size(size, grid_size)
    rows = torch.stack([chain_rows(h, sam_image_size, int(H), grid_size) for H, _ in sizes])  # [M, g, h]
    cols = torch.stack([chain_rows(w, sam_image_size, int(W), grid_size) for _, W in sizes])  # [M, g, w]
    rows, cols = rows.to(z.device, torch.float32), cols.to(z.device, torch.float32)
    with torch.autocast(z.device.type, enabled=False):
        return rows @ z @ cols.transpose(1, 2)  # [M, g, g]


def cells_to_masks(cells: Tensor, sizes: Sequence[tuple[int, int]]) -> list[Tensor]:
    """M bool ``[H, W]`` masks (on ``cells``' device) whose region cells are exactly ``cells [M, g, g]`` bool."""
    M, g, _ = cells.shape
    if len(sizes) != M:
        raise ValueError(f"cells_to_masks got {M} cell grids but {len(sizes)} image sizes")
    masks = []
    for grid, (H, W) in zip(cells.bool(), sizes):
        _check_size((H, W), g)
        owner = [torch.searchsorted(region_sample_points(int(L), g), torch.arange(int(L)), right=True) - 1
                 for L in (H, W)]  # [H], [W]: the cell whose span [p_r, p_{r+1}) holds the pixel
        masks.append(grid[owner[0].to(grid.device)][:, owner[1].to(grid.device)])  # [H, W]
    return masks


@dataclass(frozen=True)
class MaskChain:
    """The released chain of M mask rows: low-res logits -> image-size masks, and region cells <-> masks.

    Attributes:
        sizes: M image sizes (H, W); sam_image_size: S_sam; grid_size: g of the region cells (None for a family
            without region tokens, the Qwen-VL one: no region logits then).
    """

    sizes: tuple[tuple[int, int], ...]
    sam_image_size: int
    grid_size: int | None

    def to_masks(self, low_res_logits: Tensor) -> list[Tensor]:
        """M bool ``[H, W]`` masks of ``low_res_logits [M, h, w]`` (upstream's chain, ``logits_to_masks``)."""
        return logits_to_masks(low_res_logits, list(self.sizes), self.sam_image_size)

    def region_logits(self, low_res_logits: Tensor) -> Tensor:
        """fp32 ``[M, g, g]``: the chain's values at the region sample points (:func:`region_logits`)."""
        if self.grid_size is None:
            raise ValueError("region logits need the model's region-token grid, which this family (Qwen-VL) does "
                             "not have; use mask_policy 'bernoulli', 'gaussian_seg' or 'multimask'")
        return region_logits(low_res_logits, self.sizes, self.sam_image_size, self.grid_size)

    def cells_to_masks(self, cells: Tensor) -> list[Tensor]:
        """M bool ``[H, W]`` masks whose region cells are ``cells [M, g, g]`` (:func:`cells_to_masks`)."""
        return cells_to_masks(cells, self.sizes)

    def every(self, step: int) -> "MaskChain":
        """Rows ``0, step, 2 step, ...`` (one row per group of ``step`` rollouts)."""
        return MaskChain(self.sizes[::step], self.sam_image_size, self.grid_size)
