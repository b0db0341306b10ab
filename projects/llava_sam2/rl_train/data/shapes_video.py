"""Shapes world on video: moving shapes, exact masklets, and the image world's captions and referring expressions.

A clip comes from the image world's scene sampler (``shapes_scene.sample_scene``) with a clip layout in place of an
image layout, so attributes, distractors, captions and expressions come from one generator and one vocabulary:

* Every object is drawn as in an image (same radius, fill and rotation), at an anchor frame where it lies wholly
  inside the frame, and then translates with its own velocity (speed 0.25-1 x ``max_speed_per_frame`` of the image
  side per frame, any direction). With probability ``bounce`` it reflects off the frame's edges and stays wholly in
  view; otherwise it moves straight on and may enter or leave (its mask is all False while out of view). Shapes
  neither turn nor change size, so size and shape words stay true in every frame.
* The depth order is fixed (the paint order); a mask is the object's visible part in each frame, after the objects
  in front of it.
* At its key frame (the frame where its visible mask is largest, :func:`key_frame`) every object is at least
  ``MIN_VISIBLE`` visible, as in an image.
* An object's clip attributes are its size, colour, shape and the cell of its key frame, the frame loop 1 describes.
  A phrase describes an object when it is true of it in some frame where the object is seen: a stated cell matches
  every cell the object occupies during the clip. A layout in which some object's full description also fits
  another object is drawn again, so the canonical caption and every referring expression pick out one object over
  the whole clip.

Sample ``i`` of split ``s`` uses ``SeedSequence(seed, spawn_key=(VIDEO_STREAM, SPLIT_KEYS[s], i))``: random access,
byte-identical for the same (split, seed, index), disjoint streams per split and none shared with the image world
(whose spawn keys have two entries). The background is drawn once per clip (a still camera); object noise is drawn
per frame. ``domain='target'`` applies the image world's ``DomainShift`` to every frame with the same draws (the same
clutter, illumination field and sensor noise pattern in each frame), after the clip's pixels, so the source pixels,
masks and texts do not change.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
import PIL.Image

from .base import RegionDataset
from .rle import encode_mask
from .shapes import DOMAINS, SPLIT_KEYS, apply_domain_shift, object_noise, paint_objects, render_background
from .shapes_scene import (MIN_VISIBLE, ShapeObject, canonical_caption, cell_of, draw_object, matching_objects,
                           object_attributes, occlude, referring_expressions, sample_scene, shape_mask)
from .types import VideoRegionSample
from .video import check_key_frame_input, key_frame
from .video_formats.sav import SAV_FRAME_STRIDE

VIDEO_STREAM = 1  # first spawn-key entry of every clip's generator (the image world's keys have no such entry)
MIN_SPEED_SHARE = 0.25  # slowest object speed, as a share of max_speed_per_frame
JPEG_QUALITY = 95  # frames written by the write_* methods; full-resolution colour (no chroma subsampling)
# palette of the object-id PNGs of write_ref_youtube_vos: black background, then one distinct colour per object id
ID_PALETTE = [0, 0, 0, 230, 25, 75, 60, 180, 75, 255, 225, 25, 0, 130, 200] + [0] * (3 * 251)


@dataclass
class Clip:
    """One clip's objects in paint order (``centre`` = the anchor-frame position), their per-frame centres
    ``[n, T, 2]`` (x, y pixels) and visible masks bool ``[n, T, H, W]``, and the target's index.

    ``key_frames[i]``: object i's key frame; ``cells[i]``: every cell it is seen in; ``attrs[i]``: its clip attributes
    (the cell of its key frame). ``referents`` follows the image world's ``Scene.referents`` with clip cells."""

    objects: list[ShapeObject]
    centres: np.ndarray
    visible: np.ndarray
    target: int
    key_frames: list[int] = field(init=False)
    cells: list[set[str]] = field(init=False)
    attrs: list[dict[str, str]] = field(init=False)

    def __post_init__(self):
        self.key_frames = [key_frame(masks) for masks in self.visible]
        self.cells = [{cell_of(frame) for frame in masks if frame.any()} for masks in self.visible]
        self.attrs = [object_attributes(obj, cell_of(masks[key]))
                      for obj, masks, key in zip(self.objects, self.visible, self.key_frames)]

    def referents(self, attrs: dict[str, str]) -> list[int]:
        """Indices of the objects that ``attrs`` (any subset of ATTRIBUTES) describes in some frame."""
        return matching_objects(self.attrs, self.cells, attrs)

    def object_at(self, index: int, frame: int) -> ShapeObject:
        """Object ``index`` where it is in ``frame``."""
        return replace(self.objects[index], centre=tuple(float(v) for v in self.centres[index, frame]))


def reflect(coords: np.ndarray, low: float, high: float) -> np.ndarray:
    """Positions of a point bouncing between ``low`` and ``high``, from its free-flight ``coords`` (a triangle wave)."""
    span = high - low
    folded = np.mod(coords - low, 2 * span)
    return low + np.where(folded <= span, folded, 2 * span - folded)


def trajectory(rng: np.random.Generator, obj: ShapeObject, side: int, num_frames: int, max_speed_per_frame: float,
               bounce: float) -> tuple[int, np.ndarray]:
    """(anchor frame, centres ``[T, 2]``): ``obj`` sits at ``obj.centre`` in the anchor frame and moves at a constant
    velocity, reflecting off the edges (centre kept in ``[r + 2, side - r - 2]``) with probability ``bounce``."""
    anchor = int(rng.integers(num_frames))
    speed = rng.uniform(MIN_SPEED_SHARE, 1.0) * max_speed_per_frame * side
    heading = rng.uniform(0, 2 * math.pi)
    bounces = rng.random() < bounce
    steps = np.arange(num_frames, dtype=np.float64) - anchor                                      # [T]
    centres = np.asarray(obj.centre) + steps[:, None] * speed * np.array([math.cos(heading), math.sin(heading)])
    if bounces:
        centres = reflect(centres, obj.radius + 2, side - obj.radius - 2)                         # [T, 2]
    return anchor, centres


def place_clip(rng: np.random.Generator, attrs: list[tuple[str, str, str]], side: int, *, num_frames: int,
               max_speed_per_frame: float, bounce: float) -> Clip | None:
    """Random moving layout for the given attributes (target first), in random paint order; None if a rule fails."""
    order = rng.permutation(len(attrs))
    objects, anchors, centres = [], [], []
    for i in order:
        obj = draw_object(rng, *attrs[i], side)
        anchor, path = trajectory(rng, obj, side, num_frames, max_speed_per_frame, bounce)
        objects.append(obj)
        anchors.append(anchor)
        centres.append(path)
    centres = np.stack(centres)                                                                   # [n, T, 2]
    full = np.stack([[shape_mask(replace(obj, centre=tuple(c)), side) for c in path]
                     for obj, path in zip(objects, centres)])                                     # [n, T, H, W]
    visible = occlude(full)
    whole = full[np.arange(len(objects)), anchors].sum(axis=(1, 2))                               # [n] wholly inside
    if (visible.sum(axis=(2, 3)).max(axis=1) < MIN_VISIBLE * whole).any():
        return None
    clip = Clip(objects, centres, visible, target=int(np.flatnonzero(order == 0)[0]))
    unique = all(clip.referents(own) == [i] for i, own in enumerate(clip.attrs))
    return clip if unique else None


def render_clip(clip: Clip, rng: np.random.Generator) -> np.ndarray:
    """Still background + the objects' visible parts in each frame, uint8 ``[T, H, W, 3]``."""
    _, num_frames, side, _ = clip.visible.shape
    background = render_background(rng, side)
    noise = object_noise(rng, (num_frames, side, side))                                           # [T, H, W, 3]
    frames = np.repeat(background[None], num_frames, axis=0)                                      # [T, H, W, 3]
    return paint_objects(frames, clip.objects, clip.visible, noise)


class ShapesVideoWorld(RegionDataset):
    """Seeded procedural video data: one clip per sample, the target object's masklet is the region.

    Args:
        split: ``'train'``, ``'val'`` or ``'test'`` (disjoint random streams).
        num_samples: dataset length.
        seed: base seed; same (split, seed, index) -> byte-identical sample.
        image_size: side of the square frames.
        num_frames: frames per clip.
        min_objects / max_objects: objects per clip (1-4 by default).
        max_speed_per_frame: fastest object speed, as a fraction of the image side per frame (0 = still objects).
        bounce: probability that an object reflects off the frame's edges (stays in view) rather than moving straight
            on (may enter or leave).
        domain / shift / start: as in ``ShapesWorld`` (the target domain shifts every frame's pixels the same way).

    ``captions`` = [canonical caption of the clip attributes], ``expressions`` = >= 3 distinct referring phrasings,
    ``frame_names`` = ``'00000'``, ``'00001'``, ...; the model's input check (``set_input_check``) is applied to the
    key frame, the image region loop 1 gives the model.

    ``write_mevis``, ``write_ref_youtube_vos`` and ``write_sav`` write the clips in the MeViS, Ref-YouTube-VOS and
    SA-V on-disk layouts (``data/video_formats``).
    """

    def __init__(self, split: str = "train", num_samples: int = 1000, seed: int = 0, *, image_size: int = 224,
                 num_frames: int = 16, min_objects: int = 1, max_objects: int = 4, max_speed_per_frame: float = 0.04,
                 bounce: float = 0.5, domain: str = "source", shift: float = 1.0, start: int = 0):
        checks = [(split in SPLIT_KEYS, f"split={split!r} is not one of {tuple(SPLIT_KEYS)}"),
                  (image_size >= 32, f"image_size={image_size} is too small; use >= 32 pixels"),
                  (num_frames >= 1, f"num_frames={num_frames}; use >= 1"),
                  (1 <= min_objects <= max_objects <= 4,
                   f"need 1 <= min_objects <= max_objects <= 4, got {min_objects}, {max_objects}"),
                  (min(num_samples, shift, start) >= 0, f"num_samples={num_samples}, shift={shift}, start={start} "
                                                         "must be >= 0"),
                  (max_speed_per_frame >= 0, f"max_speed_per_frame={max_speed_per_frame} must be >= 0"),
                  (0 <= bounce <= 1, f"bounce={bounce} is a probability; use a value in [0, 1]"),
                  (domain in DOMAINS, f"domain={domain!r} is not one of {DOMAINS}")]
        problems = [message for passed, message in checks if not passed]
        if problems:
            raise ValueError("ShapesVideoWorld: " + "; ".join(problems))
        super().__init__(f"shapes_video_{split}" if domain == "source" else f"shapes_video_{domain}_{split}")
        self.split, self.num_samples, self.seed, self.start = split, int(num_samples), int(seed), int(start)
        self.image_size, self.num_frames = image_size, num_frames
        self.min_objects, self.max_objects = min_objects, max_objects
        self.max_speed_per_frame, self.bounce = float(max_speed_per_frame), float(bounce)
        self.domain, self.shift = domain, float(shift)

    def __len__(self) -> int:
        return self.num_samples

    def clip(self, index: int, *, render: bool = True) -> tuple[Clip, np.ndarray | None]:
        """The clip of sample ``index`` and its uint8 ``[T, H, W, 3]`` frames (None with ``render=False``: the clip is
        drawn before its pixels, so it is the same)."""
        rng = np.random.default_rng(np.random.SeedSequence(
            self.seed, spawn_key=(VIDEO_STREAM, SPLIT_KEYS[self.split], self.start + int(index))))
        place = partial(place_clip, num_frames=self.num_frames, max_speed_per_frame=self.max_speed_per_frame,
                        bounce=self.bounce)
        clip = sample_scene(rng, self.image_size, self.min_objects, self.max_objects, place=place)
        if not render:
            return clip, None
        frames = render_clip(clip, rng)
        if self.domain == "target":
            shift_seed = int(rng.integers(2 ** 63))  # one draw per clip: every frame gets the same clutter and fields
            frames = np.stack([apply_domain_shift(frame, clip.visible[:, t].any(axis=0),
                                                  np.random.default_rng(shift_seed), self.shift)
                               for t, frame in enumerate(frames)])
        return clip, frames

    def load(self, index: int) -> VideoRegionSample:
        clip, frames = self.clip(index)
        attrs, masks = clip.attrs[clip.target], clip.visible[clip.target].copy()
        position = self.start + index
        sample = VideoRegionSample(frames=[PIL.Image.fromarray(frame) for frame in frames], gt_masks=masks,
                                   captions=[canonical_caption(attrs)],
                                   expressions=referring_expressions(clip, clip.target),
                                   sample_id=f"{self.name}/{position}#{position}", source=self.name,
                                   frame_names=self.frame_names(), category=attrs["shape"])
        check_key_frame_input(self.input_check, sample.frames, masks, frame_names=sample.frame_names,
                              file=f"{self.name} (generated, seed {self.seed})", sample_id=sample.sample_id)
        return sample

    def write_mevis(self, out_dir: str, *, all_objects: bool = False) -> dict[str, str]:
        """Write the clips in MeViS's layout; returns the ``MeViSDataset`` arguments (``expression_file``,
        ``mask_file``, ``image_root``).

        ``<out_dir>/meta_expressions.json`` holds one video per clip (video id = the clip's index in the split's stream,
        ``start`` + sample index; frames ``'00000'``, ``'00001'``, ...) with one ``exp`` per referring expression;
        ``mask_dict.json`` the masklet of each annotated object (an RLE per frame, ``null`` where the object is out of
        view); frames are ``JPEGImages/<video>/<frame>.jpg``. By default each clip annotates its target only, with
        ``anno_id`` = the clip's index, so ``MeViSDataset(..., name=world.name, num_frames=None)`` yields the world's
        samples: ids, masklets and expressions equal, frames equal up to JPEG. MeViS has no caption field, so the
        canonical caption is not written (the loaded samples have ``captions == []``). ``all_objects`` annotates
        every object of the clip (target first, ``anno_id = 4 * index + k`` for the k-th object in paint order).
        """
        image_root = os.path.join(out_dir, "JPEGImages")
        videos, mask_dict = {}, {}
        for position in range(len(self)):
            clip, frames = self.clip(position)
            index, names = self.start + position, self.frame_names()
            self.write_frames(frames, os.path.join(image_root, str(index)), names)
            expressions = {}
            for k in annotated_objects(clip, all_objects):
                anno_id = annotation_id(index, k, all_objects)
                mask_dict[str(anno_id)] = [encode_mask(m) if m.any() else None for m in clip.visible[k]]
                for text in referring_expressions(clip, k):
                    expressions[str(len(expressions))] = {"exp": text, "obj_id": [k], "anno_id": [anno_id]}
            videos[str(index)] = {"frames": names, "expressions": expressions}
        paths = dict(expression_file=os.path.join(out_dir, "meta_expressions.json"),
                     mask_file=os.path.join(out_dir, "mask_dict.json"), image_root=image_root)
        write_json(paths["expression_file"], {"videos": videos})
        write_json(paths["mask_file"], mask_dict)
        return paths

    def write_ref_youtube_vos(self, out_dir: str, *, all_objects: bool = False) -> dict[str, str]:
        """Write the clips in Ref-YouTube-VOS's layout; returns the ``RefYouTubeVOSDataset`` arguments
        (``expression_file``, ``image_root``, ``mask_root``, ``meta_file``).

        ``<out_dir>/meta_expressions/train/meta_expressions.json`` holds one video per clip (video id = the clip's
        index in the split's stream) with one ``exp`` per referring expression of the target (``all_objects``: of
        every object); ``train/Annotations/<video>/<frame>.png`` is one palette PNG per frame holding every object of
        the clip (pixel value = 1 + the object's paint-order index, 0 = background; visible masks never overlap, so
        the id map is exact); ``train/meta.json`` names each object's category (its shape); frames are
        ``train/JPEGImages/<video>/<frame>.jpg``. Sample ids are ``<name>/<video>#<object id>``; masklets,
        expressions and categories read back equal, frames equal up to JPEG. The canonical caption is not written
        (the format has no caption field).
        """
        paths = dict(expression_file=os.path.join(out_dir, "meta_expressions", "train", "meta_expressions.json"),
                     image_root=os.path.join(out_dir, "train", "JPEGImages"),
                     mask_root=os.path.join(out_dir, "train", "Annotations"),
                     meta_file=os.path.join(out_dir, "train", "meta.json"))
        videos, meta = {}, {}
        for position in range(len(self)):
            clip, frames = self.clip(position)
            video, names = str(self.start + position), self.frame_names()
            self.write_frames(frames, os.path.join(paths["image_root"], video), names)
            ids = np.zeros(clip.visible.shape[1:], dtype=np.uint8)                                    # [T, H, W]
            for k, masks in enumerate(clip.visible):
                ids[masks] = k + 1
            os.makedirs(os.path.join(paths["mask_root"], video), exist_ok=True)
            for name, frame_ids in zip(names, ids):
                png = PIL.Image.fromarray(frame_ids)  # "L"; the palette makes it "P" with the same pixel values
                png.putpalette(ID_PALETTE)
                png.save(os.path.join(paths["mask_root"], video, f"{name}.png"))
            expressions = {}
            for k in annotated_objects(clip, all_objects):
                for text in referring_expressions(clip, k):
                    expressions[str(len(expressions))] = {"exp": text, "obj_id": str(k + 1)}
            videos[video] = {"frames": names, "expressions": expressions}
            meta[video] = {"objects": {str(k + 1): {"category": clip.attrs[k]["shape"],
                                                    "frames": [n for n, m in zip(names, masks) if m.any()]}
                                       for k, masks in enumerate(clip.visible)}}
        for path, data in ((paths["expression_file"], {"videos": videos}), (paths["meta_file"], {"videos": meta})):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_json(path, data)
        return paths

    def write_sav(self, out_dir: str, *, all_objects: bool = False) -> dict[str, str]:
        """Write the clips as SA-V masklets without text (loop 1's unpaired data) in the extracted-JPEG layout;
        returns the ``SAVMaskletDataset`` arguments (``annotation_root``, ``frames_root``).

        ``<out_dir>/sav_train/<video_id>_manual.json`` per clip (video id = the clip's index in the split's stream):
        ``masklet`` lists, per annotated frame, one RLE per object (an empty mask where it is out of view, as SA-V
        stores it), ``masklet_id`` names the objects. Clip frame ``t`` is annotated frame ``t``, so it is written as
        video frame ``4 t``: ``JPEGImages_24fps/<video_id>/<4 t:05d>.jpg``. No mp4 is written. By default the target
        alone is annotated with ``masklet_id`` = the clip's index, so ``SAVMaskletDataset(annotation_root,
        frames_root, name=world.name, num_frames=None)`` yields the world's masklets under the world's sample ids
        (frame names ``'00000'``, ``'00004'``, ...); ``all_objects`` annotates every object (target first,
        ``masklet_id = 4 * index + k``).
        """
        annotation_root, frames_root = os.path.join(out_dir, "sav_train"), os.path.join(out_dir, "JPEGImages_24fps")
        os.makedirs(annotation_root, exist_ok=True)
        for position in range(len(self)):
            clip, frames = self.clip(position)
            index = self.start + position
            video_id = str(index)
            self.write_frames(frames, os.path.join(frames_root, video_id),
                              [f"{SAV_FRAME_STRIDE * t:05d}" for t in range(self.num_frames)])
            order = annotated_objects(clip, all_objects)
            ids = [annotation_id(index, k, all_objects) for k in order]
            write_json(os.path.join(annotation_root, f"{video_id}_manual.json"), {
                "video_id": video_id, "video_frame_count": float(SAV_FRAME_STRIDE * (self.num_frames - 1) + 1),
                "video_height": float(self.image_size), "video_width": float(self.image_size),
                "masklet": [[encode_mask(clip.visible[k, t]) for k in order] for t in range(self.num_frames)],
                "masklet_id": ids, "masklet_num": len(ids), "masklet_type": ["manual"] * len(ids)})
        return dict(annotation_root=annotation_root, frames_root=frames_root)

    def frame_names(self) -> list[str]:
        return [f"{t:05d}" for t in range(self.num_frames)]

    @staticmethod
    def write_frames(frames: np.ndarray, folder: str, names: list[str]) -> None:
        """uint8 ``[T, H, W, 3]`` frames as ``<folder>/<name>.jpg``."""
        os.makedirs(folder, exist_ok=True)
        for frame, name in zip(frames, names):
            PIL.Image.fromarray(frame).save(os.path.join(folder, f"{name}.jpg"), "JPEG", quality=JPEG_QUALITY,
                                            subsampling=0)


def write_json(path: str, data) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle)


def annotated_objects(clip: Clip, all_objects: bool) -> list[int]:
    """The objects a writer annotates: the target, then (``all_objects``) the others in paint order."""
    return [clip.target] + ([k for k in range(len(clip.objects)) if k != clip.target] if all_objects else [])


def annotation_id(index: int, k: int, all_objects: bool) -> int:
    """Id of object ``k`` of clip ``index`` (its index in the split's stream) in written files: the index itself for
    the target alone (so a loader's sample id is the world's), ``4 * index + k`` with ``all_objects``."""
    return 4 * index + k if all_objects else index
