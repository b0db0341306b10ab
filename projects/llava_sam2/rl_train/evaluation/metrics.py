"""Metrics of each task as one table of per-sample columns; summaries and paired comparisons with CIs.

A metric is either a mean of one per-sample value or a ratio of two per-sample sums, so the same
column function gives the point estimate, its bootstrap CI (resampling samples) and the paired
difference between two systems. RES aggregation is Sa2VA's ``RES.evaluate`` (docs/sa2va_internals.md §7.2,
checked against bytedance/Sa2VA ``projects/sa2va/evaluation/dataset/RES.py``)::

    cIoU = Σ_i |P_i ∩ G_i| / (Σ_i |P_i ∪ G_i| + 1e-10)
    gIoU = mean_i g_i,  g_i = |P_i ∩ G_i| / (|P_i ∪ G_i| + 1e-5)  (+1 where the union is empty)

An answer without a fed-back ``[SEG]`` is an empty prediction there (``_mask = _target * 0``): g_i = 0,
and its |G_i| still enters Σ∪ of cIoU. ``cIoU_seg_only`` is the cIoU over answers that produced a
mask (the "no-[SEG] skipped" reading); ``no_seg_rate`` counts the rest. Both are reported, so neither
reading is hidden.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..rewards.mask_metrics import GIOU_EPS
from .bootstrap import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    Estimate,
    bootstrap_mean,
    bootstrap_ratio,
    paired_difference,
    paired_ratio_difference,
)
from .records import EvalRecord, MaskStats, align

TASKS = ("res", "caption", "cycle_iou", "cycle_caption")
VIDEO_TASKS = ("video_res", "video_cycle_jf", "video_cycle_caption")  # evaluation/video_cycle_tasks.py


@dataclass(frozen=True)
class Metric:
    """One metric of one task.

    Attributes:
        kind: ``'mean'`` (columns gives (x_i,)) or ``'ratio'`` (columns gives (a_i, b_i): Σa/Σb).
        columns: per-record values.
        needs: a record predicate; the metric is computed only when every record satisfies it
            (e.g. METEOR 1.5 scores exist).
        higher_is_better: direction, for the report.
    """

    task: str
    name: str
    kind: str
    columns: Callable[[EvalRecord], tuple[float, ...]]
    help: str
    needs: Callable[[EvalRecord], bool] = lambda record: True
    higher_is_better: bool = True


def _mask(record: EvalRecord) -> MaskStats:
    if record.mask is None:
        raise ValueError(f"sample {record.sample_id!r} ({record.task}): record has no mask stats; re-run "
                         "`sa2va-rl evaluate` for this task")
    return record.mask


def _frame_mean(record: EvalRecord, name: str) -> float:
    values = getattr(record, name)
    if not values:
        raise ValueError(f"sample {record.sample_id!r} ({record.task}): record has no {name}; re-run the video "
                         "evaluation for this task")
    return sum(values) / len(values)


def giou_term(stats: MaskStats) -> float:
    """Sa2VA's per-expression gIoU term (module doc)."""
    return stats.intersection / (stats.union + GIOU_EPS) + (1.0 if stats.union == 0 else 0.0)


def _mask_metrics(task: str) -> list[Metric]:
    return [
        Metric(task, "cIoU", "ratio", lambda r: (_mask(r).intersection, _mask(r).union),
               "Σ∩ / Σ∪ over samples (no mask = empty prediction)"),
        Metric(task, "gIoU", "mean", lambda r: (giou_term(_mask(r)),), "mean per-sample IoU (no mask = 0)"),
        Metric(task, "cIoU_seg_only", "ratio",
               lambda r: (_mask(r).intersection * _mask(r).has_mask, _mask(r).union * _mask(r).has_mask),
               "cIoU over answers with a [SEG] mask only"),
        Metric(task, "no_seg_rate", "mean", lambda r: (float(not _mask(r).has_mask),),
               "fraction of answers without a fed-back [SEG]", higher_is_better=False),
    ]


def _caption_metrics(task: str, prefix: str) -> list[Metric]:
    return [
        Metric(task, f"{prefix}METEOR_nltk", "mean", lambda r: (r.score,), "nltk METEOR (mean over samples)"),
        Metric(task, f"{prefix}METEOR15_mean", "mean", lambda r: (r.meteor15,),
               "METEOR 1.5 segment scores (mean over samples)", needs=lambda r: r.meteor15 is not None),
        Metric(task, "empty_caption_rate", "mean", lambda r: (float(not (r.caption or "").strip()),),
               "fraction of empty captions after cleaning", higher_is_better=False),
    ]


METRICS: dict[str, list[Metric]] = {
    "res": _mask_metrics("res"),
    "caption": _caption_metrics("caption", ""),
    "cycle_iou": [Metric("cycle_iou", "cycle_IoU", "mean", lambda r: (r.score,),
                         "mean IoU(gt, mask') of mask → caption (A) → mask' (B): the Loop-1 reward"),
                  *_mask_metrics("cycle_iou"),
                  Metric("cycle_iou", "empty_caption_rate", "mean", lambda r: (float(not (r.caption or "").strip()),),
                         "fraction of empty captions from A", higher_is_better=False)],
    "cycle_caption": [*_caption_metrics("cycle_caption", "cycle_"),
                      Metric("cycle_caption", "mask_IoU", "mean", lambda r: (_mask(r).iou,),
                             "mean IoU of A's intermediate mask vs GT"),
                      Metric("cycle_caption", "no_seg_rate", "mean", lambda r: (float(not _mask(r).has_mask),),
                             "fraction of A answers without a fed-back [SEG]", higher_is_better=False)],
    "video_res": [
        Metric("video_res", "j_and_f", "mean", lambda r: (r.score,), "mean J&F(gt masklet, A's masklet), every frame"),
        Metric("video_res", "j_and_f_memory_free", "mean", lambda r: (r.frames_j_and_f("memory_free"),),
               "mean J&F over the frames the language model saw (segmented without memory, as the image path)"),
        Metric("video_res", "j_and_f_propagated", "mean", lambda r: (r.frames_j_and_f("propagated"),),
               "mean J&F over the other frames (decoded from SAM2's memory)",
               needs=lambda r: r.mllm_frames is not None and len(r.frame_j or ()) > r.mllm_frames),
        Metric("video_res", "J", "mean", lambda r: (_frame_mean(r, "frame_j"),), "mean per-frame region similarity"),
        Metric("video_res", "F", "mean", lambda r: (_frame_mean(r, "frame_f"),), "mean per-frame boundary measure"),
        Metric("video_res", "no_seg_rate", "mean", lambda r: (float(not _mask(r).has_mask),),
               "fraction of answers without a fed-back [SEG]", higher_is_better=False)],
    "video_cycle_jf": [
        Metric("video_cycle_jf", "cycle_JF", "mean", lambda r: (r.score,),
               "mean J&F(gt masklet, B's masklet) of masklet → key-frame caption (A) → masklet (B): the video "
               "Loop-1 reward"),
        Metric("video_cycle_jf", "cycle_J", "mean", lambda r: (_frame_mean(r, "frame_j"),),
               "mean over masklets of the mean per-frame region similarity J"),
        Metric("video_cycle_jf", "cycle_F", "mean", lambda r: (_frame_mean(r, "frame_f"),),
               "mean over masklets of the mean per-frame boundary measure F"),
        Metric("video_cycle_jf", "no_seg_rate", "mean", lambda r: (float(not _mask(r).has_mask),),
               "fraction of B answers without a fed-back [SEG]", higher_is_better=False),
        Metric("video_cycle_jf", "empty_caption_rate", "mean", lambda r: (float(not (r.caption or "").strip()),),
               "fraction of empty captions from A", higher_is_better=False)],
    "video_cycle_caption": [
        *_caption_metrics("video_cycle_caption", "cycle_"),
        Metric("video_cycle_caption", "masklet_JF", "mean", lambda r: (r.j_and_f,),
               "mean J&F of A's intermediate masklet vs the gt masklet"),
        Metric("video_cycle_caption", "no_seg_rate", "mean", lambda r: (float(not _mask(r).has_mask),),
               "fraction of A answers without a fed-back [SEG]", higher_is_better=False)],
}

# Headline metrics per task (report bar charts, first columns of the table).
PRIMARY = {"res": ("cIoU", "gIoU"), "caption": ("METEOR_nltk", "METEOR15_mean"), "cycle_iou": ("cycle_IoU",),
           "cycle_caption": ("cycle_METEOR_nltk",), "video_res": ("j_and_f",), "video_cycle_jf": ("cycle_JF",),
           "video_cycle_caption": ("cycle_METEOR_nltk",)}


def get_metric(task: str, name: str) -> Metric:
    if task not in METRICS:
        raise ValueError(f"task {task!r}: expected one of {tuple(METRICS)}")
    for metric in METRICS[task]:
        if metric.name == name:
            return metric
    raise ValueError(f"task {task!r} has no metric {name!r}; choose from {[m.name for m in METRICS[task]]}")


def _column_lists(metric: Metric, records: Sequence[EvalRecord]) -> list[list[float]]:
    rows = [metric.columns(r) for r in records]  # N tuples of K values
    return [list(map(float, column)) for column in zip(*rows)]  # K columns of N values


def estimate(metric: Metric, records: Sequence[EvalRecord], **knobs) -> Estimate | None:
    """Point estimate + CI of one metric, or None when a record lacks what it needs."""
    if not records or not all(metric.needs(r) for r in records):
        return None
    columns = _column_lists(metric, records)
    what = f"{metric.task}/{metric.name}"
    if metric.kind == "ratio":
        return bootstrap_ratio(*columns, what=what, **knobs)
    return bootstrap_mean(columns[0], what=what, **knobs)


def summarize(task: str, records: Sequence[EvalRecord], *, n_resamples: int = DEFAULT_RESAMPLES,
              confidence: float = DEFAULT_CONFIDENCE, seed: int = 0) -> dict[str, Estimate]:
    """Every applicable metric of ``task`` over its records (metric name → Estimate)."""
    wrong = sorted({r.task for r in records} - {task})
    if wrong:
        raise ValueError(f"summarize({task!r}): got records of tasks {wrong}; pass one task's records")
    knobs = dict(n_resamples=n_resamples, confidence=confidence, seed=seed)
    out = {}
    for metric in METRICS[task]:
        value = estimate(metric, records, **knobs)
        if value is not None:
            out[metric.name] = value
    return out


def compare(task: str, metric_name: str, records_a: Sequence[EvalRecord], records_b: Sequence[EvalRecord], *,
            n_resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE, seed: int = 0
            ) -> Estimate | None:
    """Paired bootstrap CI of metric(A) − metric(B) on the samples both systems were scored on."""
    metric = get_metric(task, metric_name)
    a, b = align(records_a, records_b, f"compare {task}/{metric_name}")
    if not a or not all(metric.needs(r) for r in (*a, *b)):
        return None
    knobs = dict(n_resamples=n_resamples, confidence=confidence, seed=seed, what=f"{task}/{metric_name} A−B")
    columns_a, columns_b = _column_lists(metric, a), _column_lists(metric, b)
    if metric.kind == "ratio":
        return paired_ratio_difference(*columns_a, *columns_b, **knobs)
    return paired_difference(columns_a[0], columns_b[0], **knobs)
