"""Dynamic tiling (reference/sa2va.md §2.1), normalisation and the SAM2 resize, on small images."""
import numpy as np
import pytest
import torch
from PIL import Image

from projects.llava_sam2.rl_train.model.text.constants import IMAGENET_MEAN, IMAGENET_STD
from projects.llava_sam2.rl_train.model.text.tiling import (
    MIN_IMAGE_SIDE,
    TilingSettings,
    candidate_grids,
    check_rgb_image,
    choose_grid,
    normalise_tiles,
    sam_pixel_values,
    tile_image,
)

REAL = TilingSettings(image_size=448, min_num=1, max_num=12, use_thumbnail=True)
TOKENS_PER_TILE = 256  # (448 / 14)^2 * 0.5^2


def test_candidate_grids_cover_1_to_12_tiles_in_count_order():
    grids = candidate_grids(1, 12)
    # sum over n = 1..12 of d(n) (number of divisors) = 1+2+2+3+2+4+2+4+3+4+2+6 = 35
    assert len(grids) == 35
    counts = [cols * rows for cols, rows in grids]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] == 12
    assert set(grids) == {(c, r) for c in range(1, 13) for r in range(1, 13) if c * r <= 12}


@pytest.mark.parametrize(
    "width, height, grid, n_tiles",
    [
        # r = 1: (1,1) has diff 0. Later exact ties (2,2), (3,3) need W*H > 0.5*448^2*i*j:
        # 448*448 = 1.0*448^2 is not > 2*448^2 -> stays (1,1); a single tile has no thumbnail.
        (448, 448, (1, 1), 1),
        # tie case: 896*896 = 4*448^2 > 0.5*448^2*4 = 2*448^2 -> (2,2) replaces (1,1);
        # (3,3): 4*448^2 > 4.5*448^2 is false -> stays (2,2). 4 tiles + thumbnail.
        (896, 896, (2, 2), 5),
        # 1344^2 = 9*448^2 > 4.5*448^2 -> (3,3). 9 tiles + thumbnail.
        (1344, 1344, (3, 3), 10),
        # small square: 500*500 = 250000 is not > 0.5*448^2*4 = 401408 -> (1,1).
        (500, 500, (1, 1), 1),
        # r = 2: (2,1) exact; the later tie (4,2) needs 320000 > 0.5*448^2*8 = 802816 -> no.
        (800, 400, (2, 1), 3),
        # r = 640/480 = 4/3 exactly (same float) -> (4,3), the 12-tile maximum: 12 + thumbnail = 13.
        (640, 480, (4, 3), 13),
        # r = 10 -> (10,1) exact (no tie within <= 12 tiles): 10 + thumbnail.
        (1000, 100, (10, 1), 11),
        (100, 1000, (1, 10), 11),
        # r = 1.2: (1,1) diff 0.2 (ties (2,2), (3,3) fail the area test); (3,2)=1.5 diff 0.3;
        # (4,3)=1.333 diff 0.133 -> (4,3). Closer grids (5,4)=1.25, (6,5)=1.2 need 20/30 tiles > 12.
        (600, 500, (4, 3), 13),
    ],
)
def test_choose_grid_and_tile_counts(width, height, grid, n_tiles):
    assert choose_grid(width, height, REAL) == grid
    cols, rows = grid
    expected_tiles = cols * rows + (1 if cols * rows > 1 else 0)
    assert expected_tiles == n_tiles
    assert n_tiles * TOKENS_PER_TILE <= 13 * TOKENS_PER_TILE  # <= 3328 image tokens


def test_tile_image_counts_on_real_resizes():
    assert len(tile_image(Image.new("RGB", (896, 896)), REAL)) == 5
    assert len(tile_image(Image.new("RGB", (800, 400)), REAL)) == 3
    no_thumb = TilingSettings(448, 1, 12, use_thumbnail=False)
    assert len(tile_image(Image.new("RGB", (800, 400)), no_thumb)) == 2


def test_tiny_settings_always_one_tile():
    tiny = TilingSettings(image_size=224, min_num=1, max_num=1, use_thumbnail=True)
    for size in [(40, 30), (300, 20), (20, 300), (224, 224)]:
        tiles = tile_image(Image.new("RGB", size), tiny)
        assert len(tiles) == 1 and tiles[0].size == (224, 224)


def test_min_num_forces_more_tiles():
    # min_num=2 drops (1,1): a square image picks the first r=1 grid with >= 2 tiles, (2,2),
    # tie rule irrelevant because it is the first exact match.
    assert choose_grid(100, 100, TilingSettings(448, 2, 12)) == (2, 2)


def test_tiles_are_row_major_with_thumbnail_last():
    # 896x896 with four coloured quadrants -> grid (2,2): TL, TR, BL, BR, then the thumbnail.
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]
    image = Image.new("RGB", (896, 896))
    for index, colour in enumerate(colours):
        row, col = divmod(index, 2)
        image.paste(colour, (col * 448, row * 448, (col + 1) * 448, (row + 1) * 448))
    tiles = tile_image(image, REAL)
    assert len(tiles) == 5
    for tile, colour in zip(tiles[:4], colours):
        assert tile.getpixel((224, 224)) == colour
    thumb = tiles[4]
    assert thumb.size == (448, 448)
    assert thumb.getpixel((10, 10)) == colours[0] and thumb.getpixel((437, 437)) == colours[3]


def test_normalise_tiles_uses_imagenet_statistics():
    rgb = (128, 64, 255)
    values = normalise_tiles([Image.new("RGB", (8, 8), rgb)])
    assert values.shape == (1, 3, 8, 8) and values.dtype == torch.float32
    expected = [(c / 255 - m) / s for c, m, s in zip(rgb, IMAGENET_MEAN, IMAGENET_STD)]
    assert torch.allclose(values[0, :, 0, 0], torch.tensor(expected), atol=1e-6)


def test_sam_path_is_direct_resize_in_0_255():
    image = Image.new("RGB", (60, 20), (10, 200, 30))
    values = sam_pixel_values(image, 32)
    assert values.shape == (3, 32, 32) and values.dtype == torch.float32  # aspect not kept
    assert torch.equal(values[:, 5, 7], torch.tensor([10.0, 200.0, 30.0]))
    left_right = Image.new("RGB", (64, 16), (0, 0, 0))
    left_right.paste((255, 255, 255), (32, 0, 64, 16))
    out = sam_pixel_values(left_right, 32)
    assert out[0, 16, 2] == 0 and out[0, 16, 29] == 255  # left stays left, right stays right


@pytest.mark.parametrize("mode", ["L", "RGBA", "CMYK", "P", "1"])
def test_non_rgb_modes_are_rejected_with_the_fix(mode):
    image = Image.new(mode, (16, 16))
    with pytest.raises(ValueError, match=rf"mode '{mode}'.*convert\('RGB'\)"):
        check_rgb_image(image, "sample x")
    with pytest.raises(ValueError, match="sample x"):
        check_rgb_image(image, "sample x")


@pytest.mark.parametrize("size", [(1, 40), (40, 1), (1, 1)])
def test_too_small_images_are_rejected(size):
    assert MIN_IMAGE_SIDE == 2
    with pytest.raises(ValueError, match="minimum of 2 px"):
        tile_image(Image.new("RGB", size), REAL)


def test_zero_area_image_and_non_pil_are_rejected():
    with pytest.raises(ValueError, match="0x5"):
        check_rgb_image(Image.new("RGB", (0, 5)))
    with pytest.raises(TypeError, match="ndarray"):
        check_rgb_image(np.zeros((8, 8, 3), np.uint8))


def test_bad_tiling_settings():
    with pytest.raises(ValueError, match="min_dynamic_patch"):
        TilingSettings(448, 3, 2)
