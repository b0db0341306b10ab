"""What the model can take as input, checked before a sample reaches a training step.

Two properties of a region sample decide whether ``Sa2VAProcessor`` can turn it into a prompt:

* the image is at least ``MIN_IMAGE_SIDE`` pixels a side (``tiling.check_rgb_image``);
* under ``empty_region='raise'``, the region mask hits at least one of the g x g region-grid sample points
  (``Sa2VAProcessor.region_cells``: nearest sampling, cell (r, c) <- pixel (floor(r*H/g), floor(c*W/g))).

``InputCheck`` answers both questions from plain numbers (no tokenizer), so a dataset can apply it while loading
(``data.base.RegionDataset.set_input_check``): a sample that fails becomes a bad sample that ``on_bad_sample``
raises (naming file and sample) or skips and counts, instead of an error in the middle of a training step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .tiling import MIN_IMAGE_SIDE

# region-grid side of every released Sa2VA checkpoint: 448 px tiles, 14 px patches, pixel-shuffle ratio 0.5
UPSTREAM_REGION_GRID_SIZE = 16


def region_grid_size(image_size: int, patch_size: int, downsample_ratio: float) -> int:
    """g: region-token cells per side of a tile, (image_size / patch_size) * downsample_ratio."""
    return int(image_size // patch_size * downsample_ratio)


def nearest_cells(mask: torch.Tensor, grid_size: int) -> torch.Tensor:
    """bool ``[g, g]``: the region-grid cells whose nearest sample pixel is foreground in float ``mask [H, W]``."""
    return F.interpolate(mask[None, None], size=(grid_size, grid_size), mode="nearest")[0, 0] > 0  # [g, g]


@dataclass(frozen=True)
class InputCheck:
    """The model-side limits a region sample must meet (module docstring).

    Attributes:
        region_grid_size: g of the model's processor.
        empty_region: the processor's empty-region policy; only ``'raise'`` makes an off-grid region a bad sample.
    """

    region_grid_size: int
    empty_region: str = "raise"

    def problem(self, image, gt_mask) -> tuple[str, str] | None:
        """``(problem kind, detail)`` when the model cannot take (PIL ``image``, bool ``gt_mask [H, W]``), else None.

        Kinds: ``'image_too_small'`` and ``'region_off_grid'`` (``data.bad_samples.PROBLEMS`` says how to fix each).
        """
        width, height = image.size
        if min(width, height) < MIN_IMAGE_SIDE:
            return ("image_too_small", f"image is {width}x{height} (WxH), below the model's minimum of "
                    f"{MIN_IMAGE_SIDE} px per side")
        if self.empty_region != "raise":
            return None
        mask = torch.from_numpy(np.asarray(gt_mask, dtype=np.float32))  # [H, W]
        if not bool(nearest_cells(mask, self.region_grid_size).any()):
            g = self.region_grid_size
            return ("region_off_grid", f"region of {int(mask.sum())} px in a {height}x{width} image hits none of "
                    f"the {g}x{g} region-grid sample points, so it would get 0 region tokens "
                    "(empty_region='raise')")
        return None
