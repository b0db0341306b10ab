"""Shapes world, part 2: rendering, the ``ShapesWorld`` dataset and its COCO-style export.

Sample ``i`` of split ``s`` is drawn from its own generator, seeded with
``SeedSequence(seed, spawn_key=(SPLIT_KEYS[s], i))``: samples are random-access, the same
(split, seed, index) always gives byte-identical pixels, and the splits use disjoint streams.

Image = textured background (grey base, random tint, smooth low-frequency field, a few stripes,
per-pixel noise; every channel in [80, 180]) + objects painted in order with their fill colour and
+-``OBJECT_NOISE`` per-pixel noise. No object pixel is within ``OBJECT_NOISE`` of another colour
name's fill or of the background, so a mask can be checked against the pixels it covers.
"""
from __future__ import annotations

import json
import os

import numpy as np
import PIL.Image
import PIL.ImageDraw

from .bad_samples import BadSampleError
from .base import RegionDataset
from .rle import encode_mask
from .shapes_scene import SHAPES, Scene, canonical_caption, referring_expressions, sample_scene
from .types import RegionSample

SPLIT_KEYS = {"train": 0, "val": 1, "test": 2}
OBJECT_NOISE = 10           # per-pixel, per-channel uniform noise on objects
BACKGROUND_RANGE = (80, 180)


def render_background(rng: np.random.Generator, side: int) -> np.ndarray:
    """Textured background, uint8 ``[side, side, 3]``."""
    base = (rng.uniform(100, 160) + rng.uniform(-10, 10, size=3)).astype(np.float32)   # [3]
    coarse = rng.normal(0.0, 18.0, size=(6, 6, 3)).astype(np.float32)                  # [6, 6, 3]
    smooth = np.stack([np.asarray(PIL.Image.fromarray(coarse[..., c])
                                  .resize((side, side), PIL.Image.BILINEAR)) for c in range(3)], -1)
    stripes = PIL.Image.new("L", (side, side), 0)
    draw = PIL.ImageDraw.Draw(stripes)
    for _ in range(int(rng.integers(0, 4))):
        ends = [tuple(float(v) for v in rng.uniform(0, side, size=2)) for _ in range(2)]
        draw.line(ends, fill=int(rng.integers(1, 40)), width=int(rng.integers(2, 6)))
    stripe = np.asarray(stripes, dtype=np.float32)[..., None]                          # [side, side, 1]
    smooth += np.where(stripe > 0, stripe - 20.0, 0.0).astype(np.float32)              # strokes: -19..+19
    smooth += base + rng.integers(-10, 11, size=(side, side, 3), dtype=np.int8)        # [side, side, 3]
    return np.clip(np.rint(smooth), *BACKGROUND_RANGE).astype(np.uint8)


def render_scene(scene: Scene, rng: np.random.Generator) -> np.ndarray:
    """Background + objects (visible parts), uint8 ``[H, W, 3]``."""
    side = scene.visible.shape[1]
    image = render_background(rng, side)
    noise = rng.integers(-OBJECT_NOISE, OBJECT_NOISE + 1, size=(side, side, 3), dtype=np.int16)
    for obj, visible in zip(scene.objects, scene.visible):
        image[visible] = np.clip(np.asarray(obj.fill, dtype=np.int16) + noise[visible], 0, 255)
    return image


class ShapesWorld(RegionDataset):
    """Seeded procedural region data: one scene per sample, the target object is the region.

    Args:
        split: ``'train'``, ``'val'`` or ``'test'`` (disjoint random streams).
        num_samples: dataset length.
        seed: base seed; same (split, seed, index) -> byte-identical sample.
        image_size: side of the square images (224 for the tiny model).
        min_objects / max_objects: objects per scene (1-4 by default).

    ``captions`` = [canonical caption], ``expressions`` = >= 3 distinct referring phrasings.
    """

    def __init__(self, split: str = "train", num_samples: int = 1000, seed: int = 0, *,
                 image_size: int = 224, min_objects: int = 1, max_objects: int = 4):
        if split not in SPLIT_KEYS:
            raise ValueError(f"ShapesWorld: split={split!r} is not one of {tuple(SPLIT_KEYS)}")
        if image_size < 32:
            raise ValueError(f"ShapesWorld: image_size={image_size} is too small; use >= 32 pixels")
        if not 1 <= min_objects <= max_objects <= 4:
            raise ValueError(f"ShapesWorld: need 1 <= min_objects <= max_objects <= 4, got "
                             f"{min_objects}, {max_objects}")
        if num_samples < 0:
            raise ValueError(f"ShapesWorld: num_samples={num_samples} must be >= 0")
        super().__init__(f"shapes_{split}")
        self.split, self.num_samples, self.seed = split, int(num_samples), int(seed)
        self.image_size, self.min_objects, self.max_objects = image_size, min_objects, max_objects

    def __len__(self) -> int:
        return self.num_samples

    def scene(self, index: int) -> tuple[Scene, np.ndarray]:
        """The scene of sample ``index`` and its rendered uint8 ``[H, W, 3]`` image."""
        rng = np.random.default_rng(np.random.SeedSequence(
            self.seed, spawn_key=(SPLIT_KEYS[self.split], int(index))))
        scene = sample_scene(rng, self.image_size, self.min_objects, self.max_objects)
        return scene, render_scene(scene, rng)

    def load(self, index: int) -> RegionSample:
        scene, pixels = self.scene(index)
        attrs = scene.attrs[scene.target]
        sample = RegionSample(image=PIL.Image.fromarray(pixels),
                              gt_mask=scene.visible[scene.target].copy(),
                              captions=[canonical_caption(attrs)],
                              expressions=referring_expressions(scene, scene.target),
                              sample_id=f"{self.name}/{index}#{index}", source=self.name,
                              category=attrs["shape"])
        problem = None if self.input_check is None else self.input_check.problem(sample.image, sample.gt_mask)
        if problem is not None:
            raise BadSampleError(*problem, file=f"{self.name} (generated, seed {self.seed})", sample_id=sample.sample_id)
        return sample

    def write_coco(self, out_dir: str, image_format: str = "png", *, all_objects: bool = False) -> str:
        """Write ``annotations.json`` + ``images/<index>.<ext>``; returns the annotation file path.

        Image ids are the sample index. By default each image has one annotation, the sample's target, with
        annotation id = sample index, so ``CocoRegionDataset(path, name=world.name)`` yields the same samples
        (pixel-exact with PNG; JPEG is lossy). With ``all_objects`` every object of the scene is annotated (target
        first; annotation id = 4 * index + k for the k-th object in paint order), as in RefCOCO, where one image
        carries several referred objects.
        """
        if image_format not in ("png", "jpg"):
            raise ValueError(f"write_coco: image_format={image_format!r}; use 'png' (lossless) or 'jpg'")
        os.makedirs(os.path.join(out_dir, "images"), exist_ok=True)
        categories = {shape: k + 1 for k, shape in enumerate(SHAPES)}
        images, annotations = [], []
        for index in range(len(self)):
            scene, pixels = self.scene(index)
            file_name = f"images/{index:06d}.{image_format}"
            PIL.Image.fromarray(pixels).save(os.path.join(out_dir, file_name), quality=95)
            images.append({"id": index, "file_name": file_name, "height": self.image_size,
                           "width": self.image_size})
            others = [k for k in range(len(scene.objects)) if k != scene.target] if all_objects else []
            for k in [scene.target, *others]:
                mask, attrs = scene.visible[k], scene.attrs[k]
                rows, cols = np.nonzero(mask)
                annotations.append({
                    "id": 4 * index + k if all_objects else index, "image_id": index,
                    "category_id": categories[attrs["shape"]], "segmentation": encode_mask(mask),
                    "area": int(mask.sum()),
                    "bbox": [int(cols.min()), int(rows.min()), int(cols.max() - cols.min() + 1),
                             int(rows.max() - rows.min() + 1)],
                    "iscrowd": 0, "caption": canonical_caption(attrs), "expressions": referring_expressions(scene, k)})
        data = {"info": {"description": f"shapes world, split={self.split}, seed={self.seed}"},
                "images": images, "annotations": annotations,
                "categories": [{"id": i, "name": s, "supercategory": "shape"} for s, i in categories.items()]}
        path = os.path.join(out_dir, "annotations.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        return path
