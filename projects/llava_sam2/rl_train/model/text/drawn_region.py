"""A region drawn into the image: loop 1's region input without region tokens, for every model family.

The InternVL family reads a region through its ``<vp>`` region tokens (mask-pooled ViT features, ``region_cells``);
the Qwen-VL family has none upstream. Both can instead be shown a copy of the image with the region's outline
painted in (:meth:`RegionOutline.draw`) and asked about "the region outlined in <colour>"
(:meth:`RegionOutline.caption_text`): the prompt holds only an ordinary image block, so any family that reads an
image reads this input. ``describe_masks(..., region_input='drawn')`` (model/pipeline/drawn_regions.py) and the
tiny pretraining's drawn caption rows use it.

The outline is the region's own pixels within ``w`` px of its outside, ``w = max(min_width_px, width_fraction ·
longer side)``, so the region's interior and everything outside it stay as they were.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from PIL import Image

from .constants import IMAGE_PLACEHOLDER
from .tiling import check_rgb_image

OUTLINE_COLOURS = {"red": (255, 0, 0), "white": (255, 255, 255), "black": (0, 0, 0)}
REGION_INPUTS = ("native", "drawn")
DRAWN_REGION_QUESTION = "<image>\nPlease give me a short description of the region outlined in {colour}."


@dataclass(frozen=True)
class RegionOutline:
    """How a region is drawn: the outline's colour (a key of ``OUTLINE_COLOURS``, named in the question) and width.

    The default (red, 1 % of the longer side, at least 2 px) is what the processors draw: base Qwen-VL models read red
    marks on photographs. The shapes world draws white (``SHAPES_WORLD_OUTLINE``): red objects hide part of a red
    outline, and a wider outline covers most of a small object's own colour, which its caption names
    (``research/drawn_region_outline_check.py`` measures both on validation scenes).
    """

    colour: str = "red"
    width_fraction: float = 0.01
    min_width_px: int = 2

    def __post_init__(self) -> None:
        if self.colour not in OUTLINE_COLOURS:
            raise ValueError(f"RegionOutline.colour={self.colour!r}: expected one of {tuple(OUTLINE_COLOURS)}")
        if not (self.width_fraction >= 0 and self.min_width_px >= 1):
            raise ValueError(f"RegionOutline: width_fraction={self.width_fraction} must be >= 0 and min_width_px="
                             f"{self.min_width_px} >= 1")

    @property
    def rgb(self) -> tuple[int, int, int]:
        return OUTLINE_COLOURS[self.colour]

    def width(self, height: int, width: int) -> int:
        """Outline width in pixels for an image of ``height`` × ``width``."""
        return max(self.min_width_px, round(self.width_fraction * max(height, width)))

    def outline_pixels(self, region_mask: Any, size: tuple[int, int]) -> np.ndarray:
        """bool ``[H, W]``: the pixels of the bool ``[H, W]`` region within the outline width of its outside."""
        mask = torch.as_tensor(np.asarray(region_mask), dtype=torch.bool)  # [H, W]
        if tuple(mask.shape) != tuple(size):
            raise ValueError(f"RegionOutline: region mask is {tuple(mask.shape)} but the image is {tuple(size)} (H, W)")
        w = self.width(*size)
        return (mask & dilate(~mask, w)).numpy()

    def draw(self, image: Image.Image, region_mask: Any) -> Image.Image:
        """A copy of the RGB ``image`` with the region's outline painted in :attr:`rgb`."""
        check_rgb_image(image)
        outline = self.outline_pixels(region_mask, (image.height, image.width))
        pixels = np.array(image.convert("RGB"))  # [H, W, 3]
        pixels[outline] = self.rgb
        return Image.fromarray(pixels)

    def question(self, question: str | None = None) -> str:
        """The region-caption question for a drawn image (``question`` must name the outline itself)."""
        return DRAWN_REGION_QUESTION.format(colour=self.colour) if question is None else question

    def caption_text(self, processor: Any, n_tiles: int, question: str | None = None) -> str:
        """The user text (no template) asking ``processor`` for the caption of the region drawn into an image of
        ``n_tiles``: the question with its single ``<image>`` expanded into an ordinary image block (no region
        tokens)."""
        text = self.question(question)
        if IMAGE_PLACEHOLDER not in text:
            text = IMAGE_PLACEHOLDER + text
        return processor.expand_image(text, n_tiles)

    def caption_prompt(self, processor: Any, n_tiles: int, question: str | None = None) -> str:
        """:meth:`caption_text` in the processor's user turn (ends with the assistant header)."""
        return processor.template_user_turn(self.caption_text(processor, n_tiles, question))


def dilate(mask: Tensor, w: int) -> Tensor:
    """bool ``[H, W]``: the pixels within ``w`` (Chebyshev distance, inside the image) of a True pixel of ``mask``.

    The square (2w+1)² window is a row pass then a column pass of shifted ORs: what a (2w+1)² max-pool with
    -inf padding gives, in O(w) bool operations a pixel (at 896 px and w = 9 about 200x faster on one CPU core than
    the float max-pool)."""
    rows = mask.clone()
    for s in range(1, w + 1):
        rows[:, s:] |= mask[:, :-s]
        rows[:, :-s] |= mask[:, s:]
    out = rows.clone()
    for s in range(1, w + 1):
        out[s:] |= rows[:-s]
        out[:-s] |= rows[s:]
    return out


def check_region_input(region_input: str | None, where: str) -> None:
    if region_input is not None and region_input not in REGION_INPUTS:
        raise ValueError(f"{where}: region_input={region_input!r}; expected one of {REGION_INPUTS} (or None: the "
                         "model family's own)")


# white at the 2 px floor: fully visible on every shapes-world colour and the grey background, and it leaves the most
# of a small object's own pixels (its colour) unpainted
SHAPES_WORLD_OUTLINE = RegionOutline("white", 0.01)
