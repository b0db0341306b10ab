"""Tiny Ref-YouTube-VOS, MeViS, ReVOS and SA-V clips in their real on-disk layouts (docs/data.md, "Video datasets").

Each ``make_*`` writes under ``root`` and returns the paths plus ``VideoExpected`` records: the full masklet of every
sample over all its frames, drawn here with numpy (moving rectangles, absent on some frames), so a loader test checks
decoding against an independent ground truth. Frames are seeded noise images; JPEG frames are compared with PIL's
decode of the written file, mp4 frames approximately (the codec is lossy).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import PIL.Image

from data_fixtures import rgb_image, rle

PALETTE = [0, 0, 0, 236, 95, 103, 249, 145, 87, 250, 200, 99, 153, 199, 148] + [0] * (3 * 251)


@dataclass
class VideoExpected:
    sample_id: str
    gt_masks: np.ndarray        # bool [T, H, W] over all frames of the clip
    frame_names: list           # every frame of the clip, in time order
    expressions: list
    category: str | None
    size: tuple                 # PIL (W, H)
    frame_files: list           # the file each frame is read from (JPEG), or None for mp4


def moving_box(seed: int, num_frames: int, height: int, width: int, absent=()) -> np.ndarray:
    """bool [T, H, W]: a seeded box that moves one pixel right per frame; empty on the frames in ``absent``."""
    rng = np.random.default_rng(seed)
    bh, bw = int(rng.integers(3, height // 2)), int(rng.integers(3, width // 2))
    y0, x0 = int(rng.integers(0, height - bh)), int(rng.integers(0, width - bw - num_frames))
    masks = np.zeros((num_frames, height, width), dtype=bool)
    for t in range(num_frames):
        if t not in absent:
            masks[t, y0:y0 + bh, x0 + t:x0 + t + bw] = True
    return masks


def save_id_png(path: str, ids: np.ndarray) -> None:
    """An object-id PNG as YouTube-VOS stores it: palette mode, pixel value = object id."""
    image = PIL.Image.fromarray(ids.astype(np.uint8), mode="P")
    image.putpalette(PALETTE)
    image.save(path)


def write_jpeg_frames(folder: str, names: list, seed: int, height: int, width: int) -> list:
    os.makedirs(folder, exist_ok=True)
    paths = []
    for t, name in enumerate(names):
        path = os.path.join(folder, f"{name}.jpg")
        rgb_image(seed + t, height, width).save(path, "JPEG")
        paths.append(path)
    return paths


def _dump(path: str, data) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        json.dump(data, handle)
    return path


# --------------------------------------------------------------------------- Ref-YouTube-VOS
def make_ref_youtube_vos(root: str) -> tuple[dict, list[VideoExpected]]:
    """``meta_expressions/train/meta_expressions.json``, ``train/{JPEGImages,Annotations}/<video>/<frame>``,
    ``train/meta.json``. Video ``a1`` (8 frames every 5th of the source, objects 1 and 2, three expressions, object 2
    absent on frames 2-3) and video ``b2`` (3 frames, object 1): a short clip draws frames with replacement."""
    paths = dict(expression_file=os.path.join(root, "meta_expressions", "train", "meta_expressions.json"),
                 image_root=os.path.join(root, "train", "JPEGImages"),
                 mask_root=os.path.join(root, "train", "Annotations"),
                 meta_file=os.path.join(root, "train", "meta.json"))
    plan = {"a1": (8, 24, 32, {"1": ("person", ()), "2": ("dog", (2, 3))},
                   {"0": ("the man in a red coat", "1"), "1": ("a small dog running", "2"),
                    "2": ("person on the left", "1")}),
            "b2": (3, 20, 28, {"1": ("cat", ())}, {"0": ("a cat", "1")})}
    videos, meta, expected = {}, {}, []
    for v, (video, (num_frames, h, w, objects, expressions)) in enumerate(plan.items()):
        names = [f"{5 * t:05d}" for t in range(num_frames)]
        files = write_jpeg_frames(os.path.join(paths["image_root"], video), names, 100 * v, h, w)
        masks = {obj: moving_box(10 * v + int(obj), num_frames, h, w, absent) for obj, (_, absent) in objects.items()}
        ids = np.zeros((num_frames, h, w), dtype=np.uint8)
        for obj, m in masks.items():  # later objects paint over earlier ones, as in a real id map
            ids[m] = int(obj)
        os.makedirs(os.path.join(paths["mask_root"], video), exist_ok=True)
        for t, name in enumerate(names):
            save_id_png(os.path.join(paths["mask_root"], video, f"{name}.png"), ids[t])
        videos[video] = {"expressions": {e: {"exp": text, "obj_id": obj} for e, (text, obj) in expressions.items()},
                         "frames": list(reversed(names))}  # the loader puts frames in order
        meta[video] = {"objects": {obj: {"category": cat, "frames": names} for obj, (cat, _) in objects.items()}}
        for obj in dict.fromkeys(obj for _, obj in expressions.values()):
            texts = [text for e, (text, o) in expressions.items() if o == obj]
            expected.append(VideoExpected(f"ref_youtube_vos/{video}#{obj}", ids == int(obj), names, texts,
                                          objects[obj][0], (w, h), files))
    _dump(paths["expression_file"], {"videos": videos})
    _dump(paths["meta_file"], {"videos": meta})
    return paths, expected


# --------------------------------------------------------------------------- MeViS / ReVOS
def make_mevis(root: str, *, name: str = "mevis", videos=("v001", "v002")) -> tuple[dict, list[VideoExpected]]:
    """``meta_expressions.json``, ``mask_dict.json``, ``JPEGImages/<video>/<frame>.jpg``. Video 0: objects with
    anno ids 10 and 11 (11 null on frames 1-2), expressions naming [10], [11, 10] (a union masklet) and [10] again;
    video 1: anno id 12."""
    image_root = os.path.join(root, "JPEGImages") if name == "mevis" else root
    paths = dict(expression_file=os.path.join(root, "meta_expressions.json"),
                 mask_file=os.path.join(root, "mask_dict.json"), image_root=image_root)
    plan = [(6, 20, 30, {10: (), 11: (1, 2)}, [("the bird flying away", [10]), ("two birds", [11, 10]),
                                               ("which bird is moving left?", [10])]),
            (4, 22, 26, {12: ()}, [("a car turning", [12])])]
    metas, mask_dict, expected = {}, {}, []
    for v, (video, (num_frames, h, w, annos, expressions)) in enumerate(zip(videos, plan)):
        names = [f"{t:05d}" for t in range(num_frames)]
        files = write_jpeg_frames(os.path.join(image_root, video), names, 200 + 10 * v, h, w)
        masks = {a: moving_box(a, num_frames, h, w, absent) for a, (absent) in annos.items()}
        for a, m in masks.items():
            mask_dict[str(a)] = [rle(m[t]) if m[t].any() else None for t in range(num_frames)]
        metas[video] = {"expressions": {str(e): {"exp": text, "obj_id": [a - 10 for a in ids], "anno_id": ids}
                                        for e, (text, ids) in enumerate(expressions)},
                        "frames": names}
        groups: dict = {}
        for text, ids in expressions:
            groups.setdefault(tuple(sorted(ids)), []).append(text)
        for ids, texts in groups.items():
            union = np.any([masks[a] for a in ids], axis=0)
            expected.append(VideoExpected(f"{name}/{video}#{'+'.join(map(str, ids))}", union, names, texts, None,
                                          (w, h), files))
    _dump(paths["expression_file"], {"videos": metas})
    _dump(paths["mask_file"], mask_dict)
    return paths, expected


def make_revos(root: str) -> tuple[dict, list[VideoExpected]]:
    """ReVOS: MeViS's two files; video ids are paths below the data root (the image root)."""
    return make_mevis(root, name="revos", videos=("MOSE/train/JPEGImages/a0b1", "LVVIS/train/JPEGImages/c2d3"))


# --------------------------------------------------------------------------- SA-V
SAV_STRIDE = 4


def sav_video_frames(seed: int, num_video_frames: int, height: int, width: int) -> list[np.ndarray]:
    """Smooth RGB frames (a codec keeps them close): a gradient whose brightness follows the frame index."""
    ys, xs = np.mgrid[0:height, 0:width]
    frames = []
    for t in range(num_video_frames):
        level = (seed * 37 + 9 * t) % 120
        frames.append(np.stack([xs * 120 // width + level, ys * 120 // height + level,
                                np.full_like(xs, 60 + level)], -1).astype(np.uint8))
    return frames


def make_sav(root: str, *, jpeg_frames: bool = True) -> tuple[dict, list[VideoExpected], dict]:
    """``sav_train/sav_000/sav_00000{1,2}.mp4`` + ``*_manual.json``, and (``jpeg_frames``) the extracted-frame layout
    ``JPEGImages_24fps/<video_id>/<frame:05d>.jpg`` of the annotated frames. Returns the paths, the samples, and
    ``{video_id: list of RGB frames (all video frames, uint8 [H, W, 3])}`` written to each mp4."""
    import cv2

    paths = dict(annotation_root=os.path.join(root, "sav_train"), frames_root=os.path.join(root, "JPEGImages_24fps"))
    plan = {"sav_000001": (5, 32, 48, [0, 1, 2], {1: (3,)}), "sav_000002": (3, 24, 32, [0], {})}
    expected, written = [], {}
    for v, (video_id, (annotated, h, w, masklet_ids, absent)) in enumerate(plan.items()):
        folder = os.path.join(paths["annotation_root"], "sav_000")
        os.makedirs(folder, exist_ok=True)
        frames = sav_video_frames(v, SAV_STRIDE * (annotated - 1) + 1, h, w)
        writer = cv2.VideoWriter(os.path.join(folder, f"{video_id}.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 24,
                                 (w, h))
        for frame in frames:
            writer.write(np.ascontiguousarray(frame[:, :, ::-1]))
        writer.release()
        written[video_id] = frames
        names = [f"{SAV_STRIDE * k:05d}" for k in range(annotated)]
        files = None
        if jpeg_frames:
            os.makedirs(os.path.join(paths["frames_root"], video_id), exist_ok=True)
            files = []
            for k, name in enumerate(names):
                files.append(os.path.join(paths["frames_root"], video_id, f"{name}.jpg"))
                PIL.Image.fromarray(frames[SAV_STRIDE * k]).save(files[-1], "JPEG")
        masks = [moving_box(50 + 10 * v + j, annotated, h, w, absent.get(j, ())) for j in range(len(masklet_ids))]
        data = {"video_id": video_id, "video_frame_count": float(len(frames)), "video_height": float(h),
                "video_width": float(w), "masklet": [[rle(m[k]) for m in masks] for k in range(annotated)],
                "masklet_id": masklet_ids, "masklet_num": len(masklet_ids),
                "masklet_type": ["manual"] * len(masklet_ids)}
        _dump(os.path.join(folder, f"{video_id}_manual.json"), data)
        for j, masklet_id in enumerate(masklet_ids):
            expected.append(VideoExpected(f"sav/{video_id}#{masklet_id}", masks[j], names, [], None, (w, h), files))
    return paths, expected, written
