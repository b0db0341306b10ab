"""Ref-YouTube-VOS: referring expressions over YouTube-VOS clips, masks as object-id PNGs.

Layout (docs/data.md): ``meta_expressions.json`` (``{"videos": {video: {"frames": [...], "expressions": {id: {"exp",
"obj_id"}}}}}``, ``obj_id`` a string), frames ``<image_root>/<video>/<frame>.jpg`` and masks
``<mask_root>/<video>/<frame>.png``: one palette PNG per listed frame holding every object of the clip, pixel value =
object id, 0 = background. YouTube-VOS's ``meta.json`` (``{"videos": {video: {"objects": {obj_id: {"category",
"frames"}}}}}``), when given, names each object's category and lets the index catch an expression naming an object the
clip does not have. One sample per (video, object), with all expressions of that object.
"""
from __future__ import annotations

import os

import numpy as np

from ..bad_samples import BadSampleError
from ..coco import read_json
from ..types import VideoRegionSample
from ..video import finish_video_sample, load_frames, read_id_mask
from .meta import ClipTargetDataset, clip_targets, read_meta_expressions


class RefYouTubeVOSDataset(ClipTargetDataset):
    """Masklets of Ref-YouTube-VOS objects with their referring expressions.

    Args:
        expression_file: ``meta_expressions/train/meta_expressions.json``.
        image_root: folder of ``<video>/<frame>.jpg`` (``train/JPEGImages``).
        mask_root: folder of ``<video>/<frame>.png`` (``train/Annotations``).
        meta_file: optional ``train/meta.json`` (categories; unknown object ids caught while indexing).
        name: dataset name; sample ids are ``"<name>/<video>#<obj_id>"``.
        num_frames, frame_sampling, seed: frame sampling (``data/video.py``).
        on_bad_sample, alpha: as for the image datasets.
    """

    def __init__(self, expression_file: str, image_root: str, mask_root: str, meta_file: str | None = None, *,
                 name: str = "ref_youtube_vos", num_frames: int | None = 5, frame_sampling: str = "random",
                 seed: int = 0, on_bad_sample: str = "raise", alpha: str = "raise"):
        super().__init__(name, on_bad_sample, alpha, num_frames=num_frames, frame_sampling=frame_sampling, seed=seed)
        self.expression_file, self.image_root, self.mask_root = str(expression_file), str(image_root), str(mask_root)
        self.meta_file = str(meta_file) if meta_file is not None else None
        self._objects = self._read_objects(self.meta_file) if self.meta_file else None
        videos = read_meta_expressions(self.expression_file, "Ref-YouTube-VOS expression file")
        self._clips = clip_targets(videos, self.expression_file, self.name, self._target, lambda t: str(t[0]),
                                   self.index_time_bad)

    @staticmethod
    def _read_objects(path: str) -> dict[str, dict[str, str | None]]:
        data = read_json(path, "YouTube-VOS meta file")
        if not isinstance(data, dict) or not isinstance(data.get("videos"), dict):
            raise ValueError(f"{path}: expected {{'videos': {{video: {{'objects': {{obj_id: "
                             "{'category': ...}}}}}")
        objects = {}
        for video, record in data["videos"].items():
            entries = record.get("objects", {}) if isinstance(record, dict) else {}
            objects[video] = {str(obj_id): (entry.get("category") if isinstance(entry, dict) else None)
                              for obj_id, entry in entries.items()}
        return objects

    def _target(self, video: str, expression: dict, where: dict) -> tuple:
        raw = expression.get("obj_id")
        obj_id = int(raw) if isinstance(raw, str) and raw.isdigit() else raw
        if isinstance(obj_id, bool) or not isinstance(obj_id, int) or not 1 <= obj_id <= 255:
            raise BadSampleError("unknown_object", f"obj_id {raw!r} is not an object id (1..255, the PNG pixel "
                                 "value)", **where)
        if self._objects is not None and str(obj_id) not in self._objects.get(video, {}):
            raise BadSampleError("unknown_object", f"obj_id {obj_id} is not an object of video {video} in "
                                 f"{self.meta_file} (objects {sorted(self._objects.get(video, {}))})", **where)
        return (obj_id,)

    def load(self, index: int) -> VideoRegionSample:
        clip, sample_id = self._clips[index], self.sample_id(index)
        names = [clip.frames[i] for i in self.frame_indices(index, len(clip.frames))]
        frames = load_frames([os.path.join(self.image_root, clip.video, f"{n}.jpg") for n in names],
                             alpha=self.alpha, sample_id=sample_id)
        obj_id = clip.target[0]
        masks = {n: read_id_mask(os.path.join(self.mask_root, clip.video, f"{n}.png"), obj_id, frames[0].size,
                                 sample_id=sample_id) for n in dict.fromkeys(names)}
        category = self._objects.get(clip.video, {}).get(str(obj_id)) if self._objects is not None else None
        return finish_video_sample(frames, np.stack([masks[n] for n in names]), frame_names=names, captions=[],
                                   expressions=clip.expressions, sample_id=sample_id, source=self.name,
                                   file=self.expression_file, category=category, input_check=self.input_check)
