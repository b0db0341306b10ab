"""Shapes world, part 2: rendering, the ``ShapesWorld`` dataset and its COCO-style export.

Sample ``i`` of split ``s`` is drawn from its own generator, seeded with
``SeedSequence(seed, spawn_key=(SPLIT_KEYS[s], i))``: samples are random-access, the same
(split, seed, index) always gives byte-identical pixels, and the splits use disjoint streams.

Image = textured background (grey base, random tint, smooth low-frequency field, a few stripes,
per-pixel noise; every channel in [80, 180]) + objects painted in order with their fill colour and
+-``OBJECT_NOISE`` per-pixel noise. No object pixel is within ``OBJECT_NOISE`` of another colour
name's fill or of the background, so a mask can be checked against the pixels it covers.

Domains (``domain=``): ``'source'`` is the world above, the one the committed tiny Sa2VA was pretrained on.
``'target'`` keeps every scene (the same objects, masks, captions and referring expressions for the same
(split, seed, index)) and changes only its pixels, as a camera in another setting would (``DomainShift``): grey
clutter strokes and blobs on the background, an uneven illumination gain, object colours washed toward the
background (lower contrast), sensor noise and defocus blur. No hue is shifted (captions name colours), no object
is occluded (masks stay exact) and no size changes (captions name sizes), so the vocabulary is the source's.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import PIL.Image
import PIL.ImageDraw
import PIL.ImageFilter

from .bad_samples import BadSampleError
from .base import RegionDataset
from .rle import encode_mask
from .shapes_scene import SHAPES, Scene, canonical_caption, referring_expressions, sample_scene
from .types import RegionSample

SPLIT_KEYS = {"train": 0, "val": 1, "test": 2}
DOMAINS = ("source", "target")
KEEP_CHOICES = ("paired", "regions", "texts")  # write_coco: paired data, or one half of unpaired data
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


def object_noise(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Per-pixel, per-channel object noise, int16 ``[*shape, 3]``."""
    return rng.integers(-OBJECT_NOISE, OBJECT_NOISE + 1, size=(*shape, 3), dtype=np.int16)


def paint_objects(image: np.ndarray, objects, visible: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """Paint each object's visible pixels (bool ``[n, *S]``) on uint8 ``image`` ``[*S, 3]`` in place, with its fill
    plus ``noise`` ``[*S, 3]``; returns ``image``. ``S`` is ``(H, W)`` for an image, ``(T, H, W)`` for a clip."""
    for obj, region in zip(objects, visible):
        image[region] = np.clip(np.asarray(obj.fill, dtype=np.int16) + noise[region], 0, 255)
    return image


def render_scene(scene: Scene, rng: np.random.Generator) -> np.ndarray:
    """Background + objects (visible parts), uint8 ``[H, W, 3]``."""
    side = scene.visible.shape[1]
    image = render_background(rng, side)
    return paint_objects(image, scene.objects, scene.visible, object_noise(rng, (side, side)))


@dataclass(frozen=True)
class DomainShift:
    """The target domain's pixel changes at strength 1 (``ShapesWorld(shift=s)`` scales each by s).

    Attributes:
        clutter: grey strokes and ellipses painted on background pixels only (count at strength 1).
        clutter_contrast: their grey level's distance from the image's background mean, at most (0-255 scale).
        illumination: amplitude of a smooth multiplicative gain field (gain in [1 - a, 1 + a], same for all
            channels, so hues are kept).
        washout: share of each object pixel's colour replaced by the background mean (contrast loss).
        noise: std of per-pixel, per-channel Gaussian noise.
        blur: radius of the Gaussian defocus blur in pixels at a 128-pixel image (scaled with the side).
    """

    clutter: int = 12
    clutter_contrast: float = 60.0
    illumination: float = 0.35
    washout: float = 0.35
    noise: float = 14.0
    blur: float = 1.0


def apply_domain_shift(image: np.ndarray, objects_mask: np.ndarray, rng: np.random.Generator, strength: float,
                       shift: DomainShift = DomainShift()) -> np.ndarray:
    """The target domain's pixels from a source image (uint8 ``[H, W, 3]``); ``objects_mask`` bool ``[H, W]`` is
    the union of the objects' visible masks (clutter goes around them, washout only on them)."""
    side = image.shape[0]
    out = image.astype(np.float32)
    background_mean = out[~objects_mask].mean(axis=0) if (~objects_mask).any() else out.mean(axis=(0, 1))  # [3]
    clutter = PIL.Image.new("L", (side, side), 0)
    levels = PIL.Image.new("L", (side, side), 0)
    draw, level_draw = PIL.ImageDraw.Draw(clutter), PIL.ImageDraw.Draw(levels)
    for _ in range(int(round(shift.clutter * strength))):
        grey = int(rng.integers(1, 256))
        if rng.random() < 0.5:
            ends = [tuple(float(v) for v in rng.uniform(0, side, size=2)) for _ in range(2)]
            width = max(1, int(rng.uniform(0.01, 0.04) * side))
            draw.line(ends, fill=255, width=width)
            level_draw.line(ends, fill=grey, width=width)
        else:
            x0, y0 = rng.uniform(0, side, size=2)
            w, h = rng.uniform(0.04, 0.15, size=2) * side
            draw.ellipse([x0, y0, x0 + w, y0 + h], fill=255)
            level_draw.ellipse([x0, y0, x0 + w, y0 + h], fill=grey)
    painted = (np.asarray(clutter) > 0) & ~objects_mask                                   # [H, W]
    offset = (np.asarray(levels, dtype=np.float32) / 255.0 * 2.0 - 1.0) * shift.clutter_contrast * min(strength, 1.0)
    out[painted] = background_mean.mean() + offset[painted][:, None]
    wash = shift.washout * min(strength, 1.0)
    out[objects_mask] = (1.0 - wash) * out[objects_mask] + wash * background_mean
    coarse = rng.uniform(-1.0, 1.0, size=(3, 3)).astype(np.float32)
    field_ = np.asarray(PIL.Image.fromarray(coarse).resize((side, side), PIL.Image.BILINEAR))  # [H, W]
    out *= (1.0 + shift.illumination * strength * field_)[..., None]
    out += rng.normal(0.0, shift.noise * strength, size=out.shape).astype(np.float32)
    shifted = PIL.Image.fromarray(np.clip(np.rint(out), 0, 255).astype(np.uint8))
    radius = shift.blur * strength * side / 128
    if radius > 0:
        shifted = shifted.filter(PIL.ImageFilter.GaussianBlur(radius))
    return np.asarray(shifted)


class ShapesWorld(RegionDataset):
    """Seeded procedural region data: one scene per sample, the target object is the region.

    Args:
        split: ``'train'``, ``'val'`` or ``'test'`` (disjoint random streams).
        num_samples: dataset length.
        seed: base seed; same (split, seed, index) -> byte-identical sample.
        image_size: side of the square images (224 for the tiny model).
        min_objects / max_objects: objects per scene (1-4 by default).
        domain: ``'source'`` (the pretraining world) or ``'target'`` (same scenes and texts, shifted pixels:
            ``DomainShift``); the domain's images are drawn after the scene from the same generator, so the source
            pixels do not change.
        shift: strength of the target domain's pixel changes (1.0 = ``DomainShift``'s values); ignored for source.
        start: index of the first scene in the split's stream (disjoint sets of one split: ``start`` = the end of
            the other set).

    ``captions`` = [canonical caption], ``expressions`` = >= 3 distinct referring phrasings.
    """

    def __init__(self, split: str = "train", num_samples: int = 1000, seed: int = 0, *,
                 image_size: int = 224, min_objects: int = 1, max_objects: int = 4, domain: str = "source",
                 shift: float = 1.0, start: int = 0):
        if split not in SPLIT_KEYS:
            raise ValueError(f"ShapesWorld: split={split!r} is not one of {tuple(SPLIT_KEYS)}")
        if image_size < 32:
            raise ValueError(f"ShapesWorld: image_size={image_size} is too small; use >= 32 pixels")
        if not 1 <= min_objects <= max_objects <= 4:
            raise ValueError(f"ShapesWorld: need 1 <= min_objects <= max_objects <= 4, got "
                             f"{min_objects}, {max_objects}")
        if num_samples < 0:
            raise ValueError(f"ShapesWorld: num_samples={num_samples} must be >= 0")
        if domain not in DOMAINS:
            raise ValueError(f"ShapesWorld: domain={domain!r} is not one of {DOMAINS}")
        if shift < 0 or start < 0:
            raise ValueError(f"ShapesWorld: shift={shift} and start={start} must be >= 0")
        super().__init__(f"shapes_{split}" if domain == "source" else f"shapes_{domain}_{split}")
        self.domain, self.shift, self.start = domain, float(shift), int(start)
        self.split, self.num_samples, self.seed = split, int(num_samples), int(seed)
        self.image_size, self.min_objects, self.max_objects = image_size, min_objects, max_objects

    def __len__(self) -> int:
        return self.num_samples

    def scene(self, index: int, *, render: bool = True) -> tuple[Scene, np.ndarray | None]:
        """The scene of sample ``index`` and its rendered uint8 ``[H, W, 3]`` image (None with ``render=False``:
        the scene is drawn before its pixels, so it is the same)."""
        rng = np.random.default_rng(np.random.SeedSequence(
            self.seed, spawn_key=(SPLIT_KEYS[self.split], self.start + int(index))))
        scene = sample_scene(rng, self.image_size, self.min_objects, self.max_objects)
        if not render:
            return scene, None
        pixels = render_scene(scene, rng)
        if self.domain == "target":
            pixels = apply_domain_shift(pixels, scene.visible.any(axis=0), rng, self.shift)
        return scene, pixels

    def load(self, index: int) -> RegionSample:
        scene, pixels = self.scene(index)
        attrs = scene.attrs[scene.target]
        sample = RegionSample(image=PIL.Image.fromarray(pixels),
                              gt_mask=scene.visible[scene.target].copy(),
                              captions=[canonical_caption(attrs)],
                              expressions=referring_expressions(scene, scene.target),
                              sample_id=f"{self.name}/{self.start + index}#{self.start + index}", source=self.name,
                              category=attrs["shape"])
        problem = None if self.input_check is None else self.input_check.problem(sample.image, sample.gt_mask)
        if problem is not None:
            raise BadSampleError(*problem, file=f"{self.name} (generated, seed {self.seed})", sample_id=sample.sample_id)
        return sample

    def write_coco(self, out_dir: str, image_format: str = "png", *, all_objects: bool = False,
                   keep: str = "paired", write_images: bool = True) -> str:
        """Write ``annotations.json`` + ``images/<index>.<ext>``; returns the annotation file path.

        Image ids are the index in the split's stream (``start`` + sample index; file ``images/<id>.<ext>``), so
        sets written with different ``start`` never share an id. ``write_images=False`` writes the annotations only
        (for a set whose images another set of the same world already wrote: point its ``image_root`` there). By
        default each image has one annotation, the sample's target, with
        annotation id = sample index, so ``CocoRegionDataset(path, name=world.name)`` yields the same samples
        (pixel-exact with PNG; JPEG is lossy). With ``all_objects`` every object of the scene is annotated (target
        first; annotation id = 4 * index + k for the k-th object in paint order), as in RefCOCO, where one image
        carries several referred objects.

        ``keep`` writes paired or unpaired data: ``'paired'`` (mask, caption, expressions, category), ``'regions'``
        (the mask only: no caption, expressions or category, as automatic masks come) or ``'texts'`` (caption and
        expressions only: no segmentation, box or area).
        """
        if keep not in KEEP_CHOICES:
            raise ValueError(f"write_coco: keep={keep!r}; use one of {KEEP_CHOICES}")
        if image_format not in ("png", "jpg"):
            raise ValueError(f"write_coco: image_format={image_format!r}; use 'png' (lossless) or 'jpg'")
        os.makedirs(os.path.join(out_dir, "images"), exist_ok=True)
        categories = {shape: k + 1 for k, shape in enumerate(SHAPES)}
        images, annotations = [], []
        for position in range(len(self)):
            scene, pixels = self.scene(position, render=write_images)
            index = self.start + position
            file_name = f"images/{index:06d}.{image_format}"
            if write_images:
                PIL.Image.fromarray(pixels).save(os.path.join(out_dir, file_name), quality=95)
            images.append({"id": index, "file_name": file_name, "height": self.image_size,
                           "width": self.image_size})
            others = [k for k in range(len(scene.objects)) if k != scene.target] if all_objects else []
            for k in [scene.target, *others]:
                mask, attrs = scene.visible[k], scene.attrs[k]
                rows, cols = np.nonzero(mask)
                annotation = {"id": 4 * index + k if all_objects else index, "image_id": index, "iscrowd": 0}
                if keep != "texts":
                    annotation.update({
                        "segmentation": encode_mask(mask), "area": int(mask.sum()),
                        "bbox": [int(cols.min()), int(rows.min()), int(cols.max() - cols.min() + 1),
                                 int(rows.max() - rows.min() + 1)]})
                if keep != "regions":
                    annotation.update({"category_id": categories[attrs["shape"]], "caption": canonical_caption(attrs),
                                       "expressions": referring_expressions(scene, k)})
                annotations.append(annotation)
        data = {"info": {"description": f"shapes world, split={self.split}, seed={self.seed}, domain={self.domain}, "
                                         f"shift={self.shift}, start={self.start}, keep={keep}"},
                "images": images, "annotations": annotations,
                "categories": [{"id": i, "name": s, "supercategory": "shape"} for s, i in categories.items()]}
        path = os.path.join(out_dir, "annotations.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        return path
