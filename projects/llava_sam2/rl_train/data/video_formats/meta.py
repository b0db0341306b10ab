"""``meta_expressions.json``, the expression file Ref-YouTube-VOS, MeViS and ReVOS share.

Shape: ``{"videos": {video id: {"frames": [frame name, ...], "expressions": {expression id: {"exp": str, ...}}}}}``;
what names the object differs by dataset (``obj_id`` for Ref-YouTube-VOS, ``anno_id`` lists for MeViS / ReVOS), so
the caller passes ``target_of`` to read it. Expressions naming the same target in one video are one sample.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from ..bad_samples import BadSampleError
from ..coco import read_json
from ..video import VideoRegionDataset


class ClipTarget(NamedTuple):
    video: str
    frames: tuple[str, ...]      # frame names in time order
    target: tuple                # what the expressions name (object id, or annotation ids)
    target_key: str              # the part of the sample id after '#'
    expressions: list[str]


def read_meta_expressions(path: str, what: str) -> dict:
    data = read_json(path, what)
    if not isinstance(data, dict) or not isinstance(data.get("videos"), dict):
        raise ValueError(f"{path}: expected {{'videos': {{video id: {{'frames': [...], 'expressions': {{...}}}}}}}}, "
                         f"got {sorted(data) if isinstance(data, dict) else type(data).__name__}")
    return data["videos"]


def clip_targets(videos: dict, path: str, name: str, target_of: Callable[[str, dict, dict], tuple],
                 key_of: Callable[[tuple], str], on_bad: Callable[[BadSampleError], None]) -> list[ClipTarget]:
    """One ``ClipTarget`` per (video, target), in video order then first-expression order (expression ids sorted as
    numbers when they are numbers). ``target_of(video, expression, where)`` returns the target or raises
    ``BadSampleError``. A bad expression is left out alone (``on_bad`` raises or counts it) under the id
    ``"<name>/<video>#exp<expression id>"``; the other expressions of its target stay."""
    clips = []
    for video, record in videos.items():
        frames = record.get("frames") if isinstance(record, dict) else None
        expressions = record.get("expressions") if isinstance(record, dict) else None
        if not isinstance(frames, list) or not frames or not all(isinstance(f, str) and f for f in frames) \
                or not isinstance(expressions, dict):
            on_bad(BadSampleError("bad_annotation", f"video {video!r} needs a non-empty 'frames' list of names and "
                                  "an 'expressions' dict", file=path, sample_id=f"{name}/{video}"))
            continue
        groups: dict[tuple, list[str]] = {}
        for exp_id in sorted(expressions, key=lambda e: (not e.isdigit(), int(e) if e.isdigit() else 0, e)):
            expression = expressions[exp_id]
            where = dict(file=path, sample_id=f"{name}/{video}#exp{exp_id}")
            try:
                if not isinstance(expression, dict):
                    raise BadSampleError("bad_annotation", f"expression {exp_id} must be a dict", **where)
                text = expression.get("exp")
                if not isinstance(text, str) or not text.strip():
                    raise BadSampleError("bad_annotation", f"expression {exp_id}: 'exp' must be a non-empty "
                                         f"string, got {text!r}", **where)
                target = target_of(video, expression, where)
            except BadSampleError as err:
                on_bad(err)
                continue
            groups.setdefault(target, []).append(text.strip())
        for target, texts in groups.items():
            clips.append(ClipTarget(video, tuple(sorted(frames)), target, key_of(target), texts))
    return clips


class ClipTargetDataset(VideoRegionDataset):
    """A dataset whose samples are ``self._clips`` (:class:`ClipTarget`), one per (video, target): the expression
    datasets' common indexing."""

    _clips: list[ClipTarget]

    def __len__(self) -> int:
        return len(self._clips)

    def sample_id(self, index: int) -> str:
        clip = self._clips[index]
        return f"{self.name}/{clip.video}#{clip.target_key}"
