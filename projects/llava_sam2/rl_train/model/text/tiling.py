"""Image preprocessing for Sa2VA: InternVL dynamic tiling (LLM path) and direct resize (SAM2 path).

LLM path (reference/sa2va.md §2.1), for an RGB image of W×H pixels, tile size S:

1. Candidate grids (i columns, j rows) with min_num ≤ i·j ≤ max_num, ordered by i·j ascending.
2. Walk them with r = W/H. A grid with strictly smaller |r − i/j| becomes the best; on an exact tie
   the later grid wins only if W·H > 0.5·S²·i·j (more tiles only for images large enough).
3. Resize the whole image to (S·i, S·j) (bicubic) and cut i·j tiles row-major.
4. With more than one tile and ``use_thumbnail``, append the whole image resized to S×S, last.
5. Each tile → float CHW in [0, 1] → ImageNet normalisation.

SAM2 path (§2.2): resize straight to S_sam×S_sam (aspect not kept, bicubic), CHW float in 0..255.
SAM2 normalises inside the model.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image

from .constants import IMAGENET_MEAN, IMAGENET_STD

# Smallest accepted image side. A 1-pixel side gives every region-grid cell the same source row
# (or column), so a region prompt cannot describe any layout; such images are bad samples.
MIN_IMAGE_SIDE = 2

_BICUBIC = Image.Resampling.BICUBIC  # PIL's default filter for RGB resize, as upstream relies on


@dataclass(frozen=True)
class TilingSettings:
    """Dynamic-tiling knobs; the config names are force_image_size / min_dynamic_patch / ..."""

    image_size: int = 448
    min_num: int = 1
    max_num: int = 12
    use_thumbnail: bool = True

    def __post_init__(self) -> None:
        if self.image_size < 1:
            raise ValueError(f"tiling image_size={self.image_size}: expected a positive tile size")
        if not 1 <= self.min_num <= self.max_num:
            raise ValueError(
                f"tiling min_num={self.min_num}, max_num={self.max_num}: expected "
                "1 <= min_dynamic_patch <= max_dynamic_patch; fix the config"
            )


def check_rgb_image(image: object, where: str = "image") -> Image.Image:
    """Return ``image`` if it is an RGB PIL image of at least MIN_IMAGE_SIDE px a side, else raise."""
    if not isinstance(image, Image.Image):
        raise TypeError(f"{where}: expected a PIL.Image.Image, got {type(image).__name__}")
    if image.mode != "RGB":
        raise ValueError(
            f"{where}: image mode {image.mode!r} is not 'RGB'. Convert it when loading, e.g. "
            f"image.convert('RGB') (composite RGBA/LA on a background first if transparency matters)"
        )
    width, height = image.size
    if min(width, height) < MIN_IMAGE_SIDE:
        raise ValueError(
            f"{where}: image size {width}x{height} (WxH) is below the minimum of "
            f"{MIN_IMAGE_SIDE} px per side; drop or re-export this sample"
        )
    return image


def candidate_grids(min_num: int, max_num: int) -> list[tuple[int, int]]:
    """All (columns, rows) with min_num ≤ columns·rows ≤ max_num, sorted by tile count.

    Built as a set and stably sorted, like upstream, so grids with equal tile count keep the same
    relative order (it decides exact ties between two grids of the same count).
    """
    grids = {
        (cols, rows)
        for n in range(min_num, max_num + 1)
        for cols in range(1, n + 1)
        for rows in range(1, n + 1)
        if min_num <= cols * rows <= max_num
    }
    return sorted(grids, key=lambda grid: grid[0] * grid[1])


def choose_grid(width: int, height: int, settings: TilingSettings) -> tuple[int, int]:
    """Pick (columns, rows) by the closest-aspect rule with the area tie-break (steps 1-2 above)."""
    aspect = width / height
    area = width * height
    best, best_diff = (1, 1), float("inf")
    for cols, rows in candidate_grids(settings.min_num, settings.max_num):
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
        elif diff == best_diff and area > 0.5 * settings.image_size**2 * cols * rows:
            best = (cols, rows)
    return best


def tile_image(image: Image.Image, settings: TilingSettings) -> list[Image.Image]:
    """Cut ``image`` into S×S tiles row-major, thumbnail last when there is more than one tile."""
    check_rgb_image(image)
    size = settings.image_size
    cols, rows = choose_grid(image.width, image.height, settings)
    resized = image.resize((size * cols, size * rows), _BICUBIC)
    tiles = []
    for index in range(cols * rows):
        row, col = divmod(index, cols)
        tiles.append(resized.crop((col * size, row * size, (col + 1) * size, (row + 1) * size)))
    if settings.use_thumbnail and len(tiles) > 1:
        tiles.append(image.resize((size, size), _BICUBIC))
    return tiles


_TO_NORMALISED_TENSOR = T.Compose([T.ToTensor(), T.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD)])


def normalise_tiles(tiles: list[Image.Image]) -> torch.Tensor:
    """Stack S×S tiles into ImageNet-normalised float pixel values ``[n_tiles, 3, S, S]``.

    Upstream also runs a bicubic Resize((S, S)) first; PIL returns an identical copy for a tile that
    already has that size, so it is left out.
    """
    return torch.stack([_TO_NORMALISED_TENSOR(tile) for tile in tiles])  # [n, 3, S, S]


def sam_pixel_values(image: Image.Image, sam_image_size: int) -> torch.Tensor:
    """Direct resize to S_sam×S_sam (no aspect keeping, no padding) → float ``[3, S_sam, S_sam]`` 0..255."""
    check_rgb_image(image)
    resized = np.asarray(image.resize((sam_image_size, sam_image_size), _BICUBIC))  # [S, S, 3] uint8
    return torch.from_numpy(resized.copy()).permute(2, 0, 1).float()  # [3, S, S]
