"""MeViS and ReVOS: referring (or reasoning) expressions over clips, masks as per-frame COCO RLE.

Layout (docs/data.md): ``meta_expressions.json`` (``{"videos": {video: {"frames": [...], "expressions": {id: {"exp",
"obj_id": [...], "anno_id": [...]}}}}}``), ``mask_dict.json`` (``{str(anno_id): [RLE or null per frame]}``, the
list in the order of the video's sorted ``frames``, ``null`` where the object is absent) and frames
``<image_root>/<video>/<frame>.jpg``. An expression may name several objects (several ``anno_id``): its masklet is
their union. ReVOS has the same two files (its video ids are paths below the data root, which is its image root).
One sample per (video, set of annotation ids), with all expressions naming that set.
"""
from __future__ import annotations

import os

import numpy as np

from ..bad_samples import BadSampleError
from ..coco import read_json
from ..types import VideoRegionSample
from ..video import finish_video_sample, load_frames, union_rle_masks
from .meta import ClipTargetDataset, clip_targets, read_meta_expressions


class MeViSDataset(ClipTargetDataset):
    """Masklets (unions over ``anno_id``) of MeViS expressions.

    Args:
        expression_file: ``meta_expressions.json``.
        mask_file: ``mask_dict.json`` (read whole at construction; RLEs are decoded only when a sample loads).
        image_root: folder of ``<video>/<frame>.jpg`` (MeViS: ``train/JPEGImages``; ReVOS: the data root).
        name: dataset name; sample ids are ``"<name>/<video>#<anno ids joined by '+'>"``.
        num_frames, frame_sampling, seed: frame sampling (``data/video.py``).
        on_bad_sample, alpha: as for the image datasets.
    """

    default_name = "mevis"

    def __init__(self, expression_file: str, mask_file: str, image_root: str, *, name: str | None = None,
                 num_frames: int | None = 5, frame_sampling: str = "random", seed: int = 0,
                 on_bad_sample: str = "raise", alpha: str = "raise"):
        super().__init__(name or self.default_name, on_bad_sample, alpha, num_frames=num_frames,
                         frame_sampling=frame_sampling, seed=seed)
        self.expression_file, self.mask_file, self.image_root = str(expression_file), str(mask_file), str(image_root)
        self._masks = read_json(self.mask_file, f"{type(self).__name__} mask file")
        if not isinstance(self._masks, dict):
            raise ValueError(f"{self.mask_file}: expected {{anno_id: [RLE or null per frame]}}, got "
                             f"{type(self._masks).__name__}")
        self._videos = read_meta_expressions(self.expression_file, f"{type(self).__name__} expression file")
        self._clips = clip_targets(self._videos, self.expression_file, self.name, self._target, "+".join,
                                   self.index_time_bad)

    def _target(self, video: str, expression: dict, where: dict) -> tuple:
        anno_ids = expression.get("anno_id")
        if not isinstance(anno_ids, list) or not anno_ids or not all(
                isinstance(a, (int, str)) and not isinstance(a, bool) for a in anno_ids):
            raise BadSampleError("bad_annotation", f"'anno_id' must be a non-empty list of ids, got {anno_ids!r}",
                                 **where)
        target = tuple(sorted({str(a) for a in anno_ids}, key=lambda a: (len(a), a)))
        num_frames = len(self._videos[video]["frames"])
        for anno_id in target:
            if anno_id not in self._masks:
                raise BadSampleError("unknown_object", f"anno_id {anno_id} is not in {self.mask_file}", **where)
            per_frame = self._masks[anno_id]
            if not isinstance(per_frame, list) or len(per_frame) != num_frames:
                raise BadSampleError("bad_annotation", f"{self.mask_file}[{anno_id!r}] must list one RLE or null "
                                     f"per frame ({num_frames} frames), got "
                                     f"{len(per_frame) if isinstance(per_frame, list) else type(per_frame).__name__}",
                                     **where)
        if all(rle is None for anno_id in target for rle in self._masks[anno_id]):
            raise BadSampleError("empty_mask", f"anno_id {list(target)} is null on every frame of {video}", **where)
        return target

    def load(self, index: int) -> VideoRegionSample:
        clip, sample_id = self._clips[index], self.sample_id(index)
        indices = self.frame_indices(index, len(clip.frames))
        names = [clip.frames[i] for i in indices]
        frames = load_frames([os.path.join(self.image_root, clip.video, f"{n}.jpg") for n in names],
                             alpha=self.alpha, sample_id=sample_id)
        masks = np.stack([union_rle_masks([self._masks[a][i] for a in clip.target], frames[0].size,
                                          file=self.mask_file, sample_id=sample_id) for i in indices])
        return finish_video_sample(frames, masks, frame_names=names, captions=[], expressions=clip.expressions,
                                   sample_id=sample_id, source=self.name, file=self.mask_file,
                                   input_check=self.input_check)


class ReVOSDataset(MeViSDataset):
    """ReVOS (reasoning video object segmentation): MeViS's files and rules; ``image_root`` is the data root that the
    video ids are relative to, and some expressions are questions."""

    default_name = "revos"
