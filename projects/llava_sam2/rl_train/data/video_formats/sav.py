"""SA-V masklets: objects tracked through a video, without text (loop 1's unpaired data).

Layout (docs/data.md): the SA-V train release stores per video ``<video_id>.mp4`` (24 fps) next to
``<video_id>_manual.json`` (and ``<video_id>_auto.json`` for automatic masklets). The JSON's ``masklet`` is a list over
annotated frames of a list over objects of COCO RLEs (``masklet_id`` names the objects); frames are annotated every
4th video frame, so annotated frame ``k`` is video frame ``4 k``. Frames come from the mp4 (OpenCV), or, with
``frames_root``, from JPEG folders ``<frames_root>/<video_id>/<video frame index:05d>.jpg`` as SAM 2's SA-V frame
extraction writes them. One sample per (video, masklet).

The index reads every annotation JSON once and keeps only each video's masklet ids.
"""
from __future__ import annotations

import glob
import os
from typing import NamedTuple

import numpy as np

from ..bad_samples import BadSampleError
from ..coco import read_json
from ..types import VideoRegionSample
from ..video import VideoRegionDataset, finish_video_sample, load_frames, read_video_frames, union_rle_masks

SAV_FRAME_STRIDE = 4  # 24 fps video, annotated at 6 fps
MASKLET_TYPES = ("manual", "auto")


class MaskletRecord(NamedTuple):
    annotation_file: str
    video_id: str
    position: int       # index of the object in each annotated frame's list
    masklet_id: str


class SAVMaskletDataset(VideoRegionDataset):
    """Masklets of SA-V videos (``captions`` and ``expressions`` empty).

    Args:
        annotation_root: folder searched recursively for ``*_<masklet_type>.json`` (e.g. ``sav_train``).
        frames_root: folder of ``<video_id>/<frame:05d>.jpg``; None reads ``<video_id>.mp4`` beside the JSON.
        masklet_type: ``'manual'`` or ``'auto'``.
        name: dataset name; sample ids are ``"<name>/<video_id>#<masklet_id>"``.
        num_frames, frame_sampling, seed: frame sampling over the annotated frames (``data/video.py``).
        on_bad_sample, alpha: as for the image datasets.
    """

    def __init__(self, annotation_root: str, frames_root: str | None = None, *, masklet_type: str = "manual",
                 name: str = "sav", num_frames: int | None = 5, frame_sampling: str = "random", seed: int = 0,
                 on_bad_sample: str = "raise", alpha: str = "raise"):
        super().__init__(name, on_bad_sample, alpha, num_frames=num_frames, frame_sampling=frame_sampling, seed=seed)
        if masklet_type not in MASKLET_TYPES:
            raise ValueError(f"SAVMaskletDataset: masklet_type={masklet_type!r} is not one of {MASKLET_TYPES}")
        self.annotation_root = str(annotation_root)
        self.frames_root = str(frames_root) if frames_root is not None else None
        files = sorted(glob.glob(os.path.join(self.annotation_root, "**", f"*_{masklet_type}.json"), recursive=True))
        if not files:
            raise ValueError(f"SAVMaskletDataset: no *_{masklet_type}.json under {self.annotation_root}")
        self._masklets: list[MaskletRecord] = []
        for path in files:
            try:
                self._masklets.extend(self._index_video(path, masklet_type))
            except BadSampleError as err:
                self.index_time_bad(err)

    def _index_video(self, path: str, masklet_type: str) -> list[MaskletRecord]:
        data = read_json(path, "SA-V annotation file")
        video_id = os.path.basename(path)[: -len(f"_{masklet_type}.json")]
        if isinstance(data, dict) and isinstance(data.get("video_id"), str):
            video_id = data["video_id"]
        masklet, ids = (data.get("masklet"), data.get("masklet_id")) if isinstance(data, dict) else (None, None)
        where = dict(file=path, sample_id=f"{self.name}/{video_id}")
        if not isinstance(masklet, list) or not masklet or not isinstance(ids, list) or not ids:
            raise BadSampleError("bad_annotation", "needs a non-empty 'masklet' (frames x objects RLEs) and "
                                 "'masklet_id' list", **where)
        widths = {len(frame) if isinstance(frame, list) else -1 for frame in masklet}
        if widths != {len(ids)}:
            raise BadSampleError("bad_annotation", f"every annotated frame must hold one RLE per masklet id "
                                 f"({len(ids)}), got lists of {sorted(widths)}", **where)
        return [MaskletRecord(path, video_id, position, str(masklet_id)) for position, masklet_id in enumerate(ids)]

    def __len__(self) -> int:
        return len(self._masklets)

    def sample_id(self, index: int) -> str:
        record = self._masklets[index]
        return f"{self.name}/{record.video_id}#{record.masklet_id}"

    def load(self, index: int) -> VideoRegionSample:
        record, sample_id = self._masklets[index], self.sample_id(index)
        where = dict(file=record.annotation_file, sample_id=sample_id)
        data = read_json(record.annotation_file, "SA-V annotation file")
        masklet = data.get("masklet") if isinstance(data, dict) else None
        if not isinstance(masklet, list) or not all(isinstance(f, list) and len(f) > record.position
                                                    for f in masklet):
            raise BadSampleError("bad_annotation", "the file changed since indexing: 'masklet' no longer holds "
                                 f"object {record.position} on every frame", **where)
        indices = self.frame_indices(index, len(masklet))
        video_frames = [SAV_FRAME_STRIDE * i for i in indices]
        names = [f"{v:05d}" for v in video_frames]
        if self.frames_root is None:
            video = os.path.join(os.path.dirname(record.annotation_file), f"{record.video_id}.mp4")
            frames = read_video_frames(video, video_frames, alpha=self.alpha, sample_id=sample_id)
        else:
            frames = load_frames([os.path.join(self.frames_root, record.video_id, f"{n}.jpg") for n in names],
                                 alpha=self.alpha, sample_id=sample_id)
        masks = np.stack([union_rle_masks([masklet[i][record.position]], frames[0].size, **where) for i in indices])
        return finish_video_sample(frames, masks, frame_names=names, captions=[], expressions=[],
                                   sample_id=sample_id, source=self.name, file=record.annotation_file,
                                   input_check=self.input_check)
