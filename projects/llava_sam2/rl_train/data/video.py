"""What every video loader shares: seeded frame sampling, frame and mask reading, the final checks.

A video sample is one object of one clip (its masklet) with its text, drawn on ``num_frames`` frames of the clip
(docs/data.md, "Video datasets"). The loaders themselves live in ``data/video_formats/``.

Frame sampling follows the training recipe of the released Sa2VA models: a few frames per clip (5 in their configs),
drawn at random without replacement and put back in time order; a clip with fewer than ``num_frames + 2`` frames is
drawn with replacement (so a frame can repeat). ``'random_or_contiguous'`` instead takes, half of the time, a run of
``num_frames`` consecutive frames starting anywhere but at the very last possible start (the recipe's contiguous
option). ``'uniform'`` is deterministic (evenly spaced frames, for evaluation), and ``num_frames=None`` keeps every
frame. The random draws come from a generator seeded by ``(seed, epoch, index)``, so a sample's frames are the same in
every process and every run, and change with ``set_epoch``.

The model's input check (``set_input_check``) judges a video sample on its key frame (:func:`key_frame`, the drawn
frame where the masklet is largest): loop 1 shows the model that frame as an image region, so the image rule (an
image large enough, a region that hits the region grid) applies to it; the other frames go to SAM 2 as they are.
Every video dataset, the loaders and ``ShapesVideoWorld``, applies it through :func:`check_key_frame_input`.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import PIL.Image

from .bad_samples import BadSampleError
from .base import RegionDataset, check_utf8
from .images import load_rgb, to_rgb
from .rle import decode_rle
from .types import VideoRegionSample

FRAME_SAMPLING = ("random", "random_or_contiguous", "uniform")


def check_frame_sampling(num_frames: int | None, policy: str, owner: str) -> None:
    if num_frames is not None and (not isinstance(num_frames, int) or isinstance(num_frames, bool)
                                   or num_frames < 1):
        raise ValueError(f"{owner}: num_frames={num_frames!r} must be a positive int, or None for every frame")
    if policy not in FRAME_SAMPLING:
        raise ValueError(f"{owner}: frame_sampling={policy!r} is not one of {FRAME_SAMPLING}")


def sample_frame_indices(clip_len: int, num_frames: int | None, policy: str,
                         rng: np.random.Generator) -> list[int]:
    """Indices (sorted, in ``[0, clip_len)``) of the frames a sample is drawn on; see the module docstring."""
    if clip_len < 1:
        raise ValueError("a clip needs at least one frame")
    if num_frames is None:
        return list(range(clip_len))
    if policy == "uniform":
        return [int(i) for i in np.linspace(0, clip_len - 1, num_frames).round()]
    enough = clip_len > num_frames + 1
    if policy == "random_or_contiguous" and enough and rng.random() < 0.5:
        start = int(rng.integers(0, clip_len - num_frames))
        return list(range(start, start + num_frames))
    return sorted(int(i) for i in rng.choice(clip_len, num_frames, replace=not enough))


class VideoRegionDataset(RegionDataset):
    """Map-style dataset of ``VideoRegionSample``: ``on_bad_sample``, ``bad_samples`` and ``__getitem__`` as for
    the image datasets, plus the frame sampling knobs.

    Args:
        name, on_bad_sample, alpha: as for ``RegionDataset``.
        num_frames: frames per sample (None: every frame of the clip).
        frame_sampling: ``'random'``, ``'random_or_contiguous'`` or ``'uniform'`` (module docstring).
        seed: seed of the frame draws.
    """

    def __init__(self, name: str, on_bad_sample: str = "raise", alpha: str = "raise", *,
                 num_frames: int | None = 5, frame_sampling: str = "random", seed: int = 0):
        super().__init__(name, on_bad_sample, alpha)
        check_frame_sampling(num_frames, frame_sampling, type(self).__name__)
        self.num_frames, self.frame_sampling, self.seed = num_frames, frame_sampling, int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Draw other frames from now on (the same ones for the same epoch)."""
        self.epoch = int(epoch)

    def frame_indices(self, index: int, clip_len: int) -> list[int]:
        """The frames sample ``index`` is drawn on (see the module docstring)."""
        rng = np.random.default_rng((self.seed, self.epoch, index))
        return sample_frame_indices(clip_len, self.num_frames, self.frame_sampling, rng)


def key_frame(masks: np.ndarray) -> int:
    """Index of the frame where the masklet bool ``[T, H, W]`` has the most pixels (the earliest on a tie): the frame
    loop 1 shows the policy as an image region. Raises ValueError for a masklet with no pixel in any frame."""
    masks = np.asarray(masks)
    if masks.ndim != 3:
        raise ValueError(f"key_frame: masks must be [T, H, W], got shape {list(masks.shape)}")
    areas = masks.reshape(len(masks), -1).sum(axis=1)  # [T]
    if not areas.any():
        raise ValueError("key_frame: the masklet is empty in every frame; a sample's object must be seen at least once")
    return int(np.argmax(areas))


def check_key_frame_input(input_check, frames: Sequence[PIL.Image.Image], gt_masks: np.ndarray, *,
                          frame_names: Sequence[str], file: str, sample_id: str) -> None:
    """Raise ``BadSampleError`` when ``input_check`` (``model.text.input_check.InputCheck`` or any object with its
    ``problem(image, gt_mask)``; None: no check) rejects the key frame of the masklet ``gt_masks`` (non-empty)."""
    if input_check is None:
        return
    key = key_frame(gt_masks)
    problem = input_check.problem(frames[key], gt_masks[key])
    if problem is not None:
        raise BadSampleError(problem[0], f"on key frame {key} ({frame_names[key]!r}), the frame the model sees as "
                             f"an image region: {problem[1]}", file=file, sample_id=sample_id)


def load_frames(paths: Sequence[str], *, alpha: str, sample_id: str) -> list[PIL.Image.Image]:
    """Decode frame files (RGB policy of ``data/images.py``); all must exist and share one size."""
    frames = []
    for path in paths:
        if not os.path.isfile(path):
            raise BadSampleError("missing_frame", f"frame file {path} does not exist", file=path,
                                 sample_id=sample_id)
        frames.append(load_rgb(path, alpha=alpha, file=path, sample_id=sample_id))
    check_frame_sizes(frames, paths, sample_id=sample_id)
    return frames


def check_frame_sizes(frames: Sequence[PIL.Image.Image], names: Sequence[str], *, sample_id: str) -> None:
    for frame, name in zip(frames, names):
        if frame.size != frames[0].size:
            raise BadSampleError("frame_size_mismatch", f"frame {name} is {frame.height}x{frame.width} but frame "
                                 f"{names[0]} is {frames[0].height}x{frames[0].width}", file=str(name),
                                 sample_id=sample_id)


def read_video_frames(path: str, indices: Sequence[int], *, alpha: str, sample_id: str) -> list[PIL.Image.Image]:
    """Frames ``indices`` (0-based, in decode order) of a video file, decoded with OpenCV (an MMEngine dependency).

    The file is read from its start up to the last wanted frame: stepping frame by frame is exact for every codec,
    where seeking lands on key frames for some.
    """
    import cv2  # a heavy import, needed only by video files

    if not os.path.isfile(path):
        raise BadSampleError("missing_frame", f"video file {path} does not exist", file=path, sample_id=sample_id)
    capture = cv2.VideoCapture(path)
    try:
        if not capture.isOpened():
            raise BadSampleError("bad_image", "OpenCV cannot open the video", file=path, sample_id=sample_id)
        wanted, found, position = set(indices), {}, 0
        last = max(indices)
        while position <= last:
            if not capture.grab():
                break
            if position in wanted:
                ok, bgr = capture.retrieve()
                if not ok:
                    raise BadSampleError("bad_image", f"frame {position} does not decode", file=path,
                                         sample_id=sample_id)
                found[position] = PIL.Image.fromarray(np.ascontiguousarray(bgr[:, :, ::-1]))
            position += 1
    finally:
        capture.release()
    if len(found) < len(wanted):
        raise BadSampleError("missing_frame", f"the video has {position} decodable frame(s) but frames "
                             f"{sorted(wanted - set(found))} are needed", file=path, sample_id=sample_id)
    frames = [to_rgb(found[i], alpha=alpha, file=path, sample_id=sample_id) for i in indices]
    check_frame_sizes(frames, [f"{path}:{i}" for i in indices], sample_id=sample_id)
    return frames


def read_id_mask(path: str, obj_id: int, size: tuple[int, int], *, sample_id: str) -> np.ndarray:
    """bool ``[H, W]`` of the pixels equal to ``obj_id`` in an object-id PNG (palette or grayscale: the pixel value
    is the object id, 0 the background), checked against the frame ``size`` (PIL ``(W, H)``)."""
    if not os.path.isfile(path):
        raise BadSampleError("missing_mask", f"mask file {path} does not exist", file=path, sample_id=sample_id)
    try:
        with PIL.Image.open(path) as image:
            image.load()
            mode, ids = image.mode, np.asarray(image)
    except (OSError, SyntaxError, ValueError) as err:
        raise BadSampleError("bad_image", f"cannot decode the mask PNG ({type(err).__name__}: {err})", file=path,
                             sample_id=sample_id) from None
    if mode not in ("P", "L"):
        raise BadSampleError("bad_annotation", f"mask PNG mode is {mode!r}; it must be a palette ('P') or "
                             "grayscale ('L') image whose pixel values are object ids", file=path,
                             sample_id=sample_id)
    if ids.shape != (size[1], size[0]):
        raise BadSampleError("rle_size_mismatch", f"mask is {list(ids.shape)} [H, W] but the frame is "
                             f"[{size[1]}, {size[0]}]", file=path, sample_id=sample_id)
    return ids == obj_id


def union_rle_masks(rles: Sequence[object], size: tuple[int, int], *, file: str, sample_id: str) -> np.ndarray:
    """Union of the RLEs of one frame at frame ``size`` (PIL ``(W, H)``). An entry is an RLE dict, None (the object
    is absent there) or a list of RLE dicts (an object stored in parts), read as their union."""
    width, height = size
    mask = np.zeros((height, width), dtype=bool)
    for entry in rles:
        for rle in (entry if isinstance(entry, list) else [entry]):
            if rle is not None:
                mask |= decode_rle(rle, height, width, file=file, sample_id=sample_id)
    return mask


def finish_video_sample(frames: list[PIL.Image.Image], gt_masks: np.ndarray, *, frame_names: list[str],
                        captions: list[str], expressions: list[str], sample_id: str, source: str, file: str,
                        category: str | None = None, input_check=None) -> VideoRegionSample:
    """Last checks shared by the video loaders: texts are valid UTF-8, one mask per frame at the frames' size, the
    masklet has a pixel on at least one of the drawn frames, and the model's ``input_check`` (when given) accepts
    its key frame (:func:`check_key_frame_input`)."""
    for field, texts in (("caption", captions), ("expression", expressions)):
        for position, text in enumerate(texts):
            check_utf8(text, f"{field} {position}", file=file, sample_id=sample_id)
    width, height = frames[0].size
    if gt_masks.shape != (len(frames), height, width):
        raise BadSampleError("rle_size_mismatch", f"masklet is {list(gt_masks.shape)} [T, H, W] but the frames "
                             f"are {len(frames)} x [{height}, {width}]", file=file, sample_id=sample_id)
    if not gt_masks.any():
        raise BadSampleError("empty_mask", f"the masklet has no pixel on the drawn frames {frame_names}", file=file,
                             sample_id=sample_id)
    check_key_frame_input(input_check, frames, gt_masks, frame_names=frame_names, file=file, sample_id=sample_id)
    return VideoRegionSample(frames=frames, gt_masks=gt_masks.astype(bool, copy=False), captions=list(captions),
                             expressions=list(expressions), sample_id=sample_id, source=source,
                             frame_names=list(frame_names), category=category)
