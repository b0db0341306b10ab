"""Is a drawn region outline visible to the tiny InternVL model? Measured on ``ShapesWorld('val', seed=0)`` scenes.

Every object of the first N validation scenes is outlined (``RegionOutline.draw``) in each candidate colour and width;
both images go through the tiny preset's tiling (one 224 px tile, bicubic, what its ViT reads), and an outline pixel
counts as visible where the drawn tile differs from the plain one by more than ``--threshold`` (of 255) in some
channel. Per setting: the mean visible share of the outline's pixels, the share of objects with at least half their
outline visible, the share of objects whose outline is mostly lost (< 25 % visible), the share of each region's pixels
left unpainted (mean and 10th percentile: the colour a caption names must stay readable) and the outline width in
ViT patches (14 px at 224) at the rendered size.

    python -m research.drawn_region_outline_check --scenes 100 --image-size 128
"""
from __future__ import annotations

import argparse
import json

import numpy as np
from PIL import Image

from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.model.text.drawn_region import OUTLINE_COLOURS, RegionOutline

TILE, PATCH = 224, 14  # the tiny preset's tile side and ViT patch


def visible_shares(outline: RegionOutline, world: ShapesWorld, scenes: int, threshold: float
                   ) -> tuple[list[float], list[float]]:
    """Per object: the visible share of its outline at the tile size, and the share of its pixels left unpainted
    (the outline is drawn on the region's own pixels, so a wide one hides a small object's colour)."""
    shares, interiors = [], []
    for index in range(scenes):
        scene, pixels = world.scene(index)
        image = Image.fromarray(pixels)
        plain = np.asarray(image.resize((TILE, TILE), Image.BICUBIC), dtype=np.int16)
        for visible in scene.visible:
            if not visible.any():
                continue
            drawn = np.asarray(outline.draw(image, visible).resize((TILE, TILE), Image.BICUBIC), dtype=np.int16)
            where = np.asarray(Image.fromarray(outline.outline_pixels(visible, visible.shape)).resize(
                (TILE, TILE), Image.NEAREST))  # [224, 224] outline pixels at the tile's size
            if where.any():
                shares.append(float((np.abs(drawn - plain).max(-1)[where] > threshold).mean()))
                interiors.append(1 - outline.outline_pixels(visible, visible.shape).sum() / visible.sum())
    return shares, interiors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", type=int, default=100)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--threshold", type=float, default=48.0)
    parser.add_argument("--width-fractions", type=float, nargs="+", default=[0.01, 0.02, 0.03])
    args = parser.parse_args(argv)
    world = ShapesWorld("val", args.scenes, 0, image_size=args.image_size)
    rows = []
    for colour in OUTLINE_COLOURS:
        for fraction in args.width_fractions:
            outline = RegionOutline(colour, fraction)
            shares, interiors = (np.array(x) for x in visible_shares(outline, world, args.scenes, args.threshold))
            width = outline.width(args.image_size, args.image_size)
            rows.append({"colour": colour, "width_fraction": fraction, "width_px": width,
                         "width_patches_at_224": round(width * TILE / args.image_size / PATCH, 2),
                         "visible_share": round(float(shares.mean()), 3),
                         "objects_half_visible": round(float((shares >= 0.5).mean()), 3),
                         "objects_mostly_lost": round(float((shares < 0.25).mean()), 3), "interior_left_mean": round(float(interiors.mean()), 3),
                         "interior_left_p10": round(float(np.quantile(interiors, 0.1)), 3), "objects": len(shares)})
            print(json.dumps(rows[-1]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
