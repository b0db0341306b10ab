"""Per-sample evaluation records and their JSONL files.

One :class:`EvalRecord` per (task, sample). Records of two systems evaluated on the same split share
``sample_id`` values, so any metric can be compared pairwise (``metrics.compare``). Field use per task:

==============  =====================  ==================  ==================  ========================
field           res                    caption             cycle_iou           cycle_caption
==============  =====================  ==================  ==================  ========================
text_in         expression given       —                   —                   GT caption given to A
answer_a        A's answer             A's caption         A's caption         A's answer
answer_b        —                      —                   B's answer          B's caption
caption         —                      cleaned A caption   A caption given B   cleaned B caption
mask            A's mask vs GT         —                   B's mask vs GT      A's mask vs GT
score           IoU                    METEOR nltk         IoU (Loop-1 reward)  METEOR nltk
==============  =====================  ==================  ==================  ========================

The video tasks (``evaluation/video_cycle_tasks.py``) use the same fields as their image counterparts (``video_res``
as ``res``, ``video_cycle_jf`` as ``cycle_iou``, both with J&F as ``score``; ``video_cycle_caption`` as
``cycle_caption``), with
``mask`` counting pixels over every frame of the masklet (no ``rle``) and four video fields: ``frame_j`` /
``frame_f`` (J and F of each frame of the scored masklet: B's in ``video_cycle_jf``, A's otherwise), ``masklet``
(that masklet as one RLE per frame, when masks are kept), ``key_frame`` (the frame the caption was written from: the
gt masklet's largest frame, or the largest-mask MLLM frame of A's masklet) and ``mllm_frames`` (n: frames 0..n-1 went
to the language model and were segmented without memory, the rest were propagated).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from ..data.rle import encode_mask


@dataclass
class MaskStats:
    """A predicted pixel mask against the ground truth, as counts.

    Attributes:
        has_mask: the answer had a fed-back ``[SEG]`` (False: the prediction counts as empty, as
            Sa2VA's ``RES.evaluate`` does with a missing mask).
        num_seg: fed-back ``[SEG]`` tokens in the answer.
        intersection / union / pred_area / gt_area: pixel counts |P∩G|, |P∪G|, |P|, |G|.
        rle: COCO compressed RLE of the predicted mask (``{"size": [H, W], "counts"}``) or None.
    """

    has_mask: bool
    num_seg: int
    intersection: int
    union: int
    pred_area: int
    gt_area: int
    rle: dict | None = None

    @property
    def iou(self) -> float:
        """Exact IoU; 1.0 when both masks are empty (rewards/mask_metrics convention)."""
        return 1.0 if self.union == 0 else self.intersection / self.union

    @classmethod
    def from_masks(cls, pred_mask: np.ndarray | None, gt_mask: np.ndarray, num_seg: int, *,
                   keep_rle: bool, sample_id: str) -> "MaskStats":
        """Counts of bool ``[H, W]`` masks; ``pred_mask=None`` is an empty prediction."""
        gt = np.asarray(gt_mask, dtype=bool)
        pred = np.zeros_like(gt) if pred_mask is None else np.asarray(pred_mask, dtype=bool)
        if pred.shape != gt.shape:
            raise ValueError(f"sample {sample_id!r}: predicted mask {pred.shape} != gt_mask {gt.shape}; the "
                             "prediction must be at image resolution")
        inter, union = int((pred & gt).sum()), int((pred | gt).sum())
        return cls(has_mask=pred_mask is not None, num_seg=int(num_seg), intersection=inter, union=union,
                   pred_area=int(pred.sum()), gt_area=int(gt.sum()),
                   rle=encode_mask(pred) if keep_rle and pred_mask is not None else None)


@dataclass
class EvalRecord:
    """One sample of one task (field use per task in the module doc).

    Attributes:
        task: ``res`` | ``caption`` | ``cycle_iou`` | ``cycle_caption``.
        sample_id: the ``RegionSample.sample_id``.
        score: the task's per-sample score (IoU or nltk METEOR).
        num_tokens: generated tokens over all stages; is_truncated: any stage hit ``max_new_tokens``.
        region_tokens: region cells shown in the caption prompt (caption tasks), else None.
        meteor15: METEOR 1.5 segment score of ``caption`` (when the jar ran), else None.
        frame_j / frame_f / masklet / key_frame / mllm_frames: video tasks only (module doc), else None.
    """

    task: str
    sample_id: str
    score: float
    text_in: str | None = None
    answer_a: str = ""
    answer_b: str | None = None
    caption: str | None = None
    references: list[str] = field(default_factory=list)
    mask: MaskStats | None = None
    num_tokens: int = 0
    is_truncated: bool = False
    region_tokens: int | None = None
    meteor15: float | None = None
    frame_j: list[float] | None = None
    frame_f: list[float] | None = None
    masklet: list[dict] | None = None
    key_frame: int | None = None
    mllm_frames: int | None = None

    @property
    def j_and_f(self) -> float:
        """(mean J + mean F) / 2 over the frames of a video record's scored masklet."""
        return self.frames_j_and_f("all")

    def frames_j_and_f(self, group: str) -> float:
        """(mean J + mean F) / 2 over the frames of ``group``: ``'all'``, ``'memory_free'`` (t < ``mllm_frames``) or
        ``'propagated'`` (t >= ``mllm_frames``)."""
        if not self.frame_j or not self.frame_f:
            raise ValueError(f"sample {self.sample_id!r} ({self.task}): the record has no per-frame J and F; it is "
                             "not a video task's record")
        if group != "all" and self.mllm_frames is None:
            raise ValueError(f"sample {self.sample_id!r} ({self.task}): the record does not say which frames went to "
                             "the language model (mllm_frames)")
        frames = {"all": slice(None), "memory_free": slice(0, self.mllm_frames),
                  "propagated": slice(self.mllm_frames, None)}[group]
        j, f = self.frame_j[frames], self.frame_f[frames]
        if not j:
            raise ValueError(f"sample {self.sample_id!r} ({self.task}): no frame in group {group!r}")
        return (sum(j) / len(j) + sum(f) / len(f)) / 2

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict, where: str = "record") -> "EvalRecord":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown or "task" not in data or "sample_id" not in data:
            raise ValueError(f"{where}: not an EvalRecord (unknown keys {unknown}, needs 'task' and 'sample_id'); "
                             "pass a records file written by `sa2va-rl evaluate`")
        mask = data.get("mask")
        return cls(**{**data, "mask": MaskStats(**mask) if isinstance(mask, dict) else None})


def write_records(path: str, records: Iterable[EvalRecord]) -> str:
    """One JSON object per line (UTF-8); returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(record.to_json() + "\n")
    return path


def read_records(path: str) -> list[EvalRecord]:
    """Records of a JSONL file; a bad line raises naming the file and line number."""
    if not os.path.isfile(path):
        raise ValueError(f"records file {path} does not exist; run `sa2va-rl evaluate` first")
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error})") from None
            records.append(EvalRecord.from_dict(data, where=f"{path}:{number}"))
    return records


def align(records_a: Sequence[EvalRecord], records_b: Sequence[EvalRecord], what: str
          ) -> tuple[list[EvalRecord], list[EvalRecord]]:
    """The two systems' records in the same sample order; different sample sets raise (controls must be
    compared on the same split)."""
    by_id_b = {r.sample_id: r for r in records_b}
    ids_a = [r.sample_id for r in records_a]
    if len(set(ids_a)) != len(ids_a) or len(by_id_b) != len(records_b):
        raise ValueError(f"{what}: duplicate sample_id in the records; each sample must be evaluated once")
    missing_b = [i for i in ids_a if i not in by_id_b]
    missing_a = sorted(set(by_id_b) - set(ids_a))
    if missing_a or missing_b:
        raise ValueError(f"{what}: the two systems were evaluated on different samples ({len(missing_b)} only in "
                         f"the first, e.g. {missing_b[:3]}; {len(missing_a)} only in the second, e.g. "
                         f"{missing_a[:3]}); evaluate both on the same split and sample count")
    return list(records_a), [by_id_b[i] for i in ids_a]
