"""PNG figures for the evaluation report (matplotlib's object API on the Agg canvas, no pyplot state).

* :func:`plot_curves` — training curves from MMEngine's ``<work_dir>/<timestamp>/vis_data/scalars.json``
  (JSON lines: ``{"<key>": value, ..., "step": iteration}``; keys as ``LoggerHook`` writes them, e.g.
  ``mask_to_caption/reward_mean``, or ``train/mask_to_caption/reward_mean`` with ``log_with_hierarchy``).
* :func:`plot_metric_bars` — systems × headline metrics, bars with bootstrap-CI whiskers.
* :func:`plot_examples` — per sample: the image with the GT region, then each system's predicted mask
  and text, for a few held-out samples. Answers are shown without the chat template's stop tokens
  (``display_text``), and a prediction without a mask (no ``[SEG]``, or an empty mask) is labelled "no mask" on
  the image, so it cannot be mistaken for a mask too small to see.
* :func:`plot_video_strip` — frames of one video sample (its masklet outlined, the key frame marked), with an
  optional predicted masklet below.
"""
from __future__ import annotations

import glob
import json
import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
from matplotlib.figure import Figure
from scipy.ndimage import binary_erosion

from xtuner.utils import PROMPT_TEMPLATE

from ..data.rle import decode_rle
from ..data.video import key_frame
from .metrics import PRIMARY, TASKS
from .records import EvalRecord

# every chat template's stop words (<|im_end|>, <|end|>, <eoa>, ...) plus the common EOS strings: records keep the
# decoded answer as generated, which a reader of the figures should not have to skip over
DISPLAY_STRIPPED = tuple(sorted({word for template in PROMPT_TEMPLATE.values()
                                 for word in template.get("STOP_WORDS", [])} | {"</s>", "<|im_start|>"}, key=len,
                                reverse=True))

GT_COLOUR = (0, 230, 255)  # cyan
PRED_COLOUR = (255, 0, 200)  # magenta
DEFAULT_CURVES = {"Loop 1 reward (mask → caption → mask')": "mask_to_caption/reward_mean",
                  "Loop 2 reward (caption → mask → caption')": "caption_to_mask/reward_mean"}


def find_scalars(path: str) -> str:
    """``path`` itself if it is a file, else the newest ``**/vis_data/scalars.json`` under it."""
    if os.path.isfile(path):
        return path
    found = sorted(glob.glob(os.path.join(path, "**", "vis_data", "scalars.json"), recursive=True))
    if not found:
        raise ValueError(f"{path}: no <timestamp>/vis_data/scalars.json under it; pass the training work_dir "
                         "(MMEngine's LocalVisBackend writes it) or the scalars.json file itself")
    return max(found, key=os.path.getmtime)


def read_scalars(path: str) -> list[dict]:
    """The JSON lines of a scalars file, with a leading ``train/`` stripped from every key."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not a JSON line ({error})") from None
            rows.append({k.removeprefix("train/"): v for k, v in row.items()})
    return rows


def _moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` points (shorter at the start)."""
    cumulative = np.cumsum(np.insert(values, 0, 0.0))
    index = np.arange(1, len(values) + 1)
    start = np.maximum(index - window, 0)
    return (cumulative[index] - cumulative[start]) / (index - start)


def plot_curves(scalars: str, out_png: str, curves: Mapping[str, str] | None = None,
                smooth: int | None = None) -> str:
    """One panel per curve: raw values (faint) and a trailing moving average (``smooth`` points,
    default ~5% of the points). ``curves`` maps a panel title to a scalar key (default: the reward of each loop the
    run trained, so a run with one loop switched off plots that loop). Requested keys missing from the file raise,
    listing the keys it has."""
    rows = read_scalars(find_scalars(scalars))
    available = sorted({k for row in rows for k in row} - {"step"})
    if curves is None:
        curves = {title: key for title, key in DEFAULT_CURVES.items() if key in available} or DEFAULT_CURVES
    curves = dict(curves)
    missing = [key for key in curves.values() if not any(key in row for row in rows)]
    if missing or not curves:
        raise ValueError(f"{scalars}: no values for scalar keys {missing}; the file has {available[:40]}. "
                         "Pass --curve 'title=key' with one of them")
    fig = Figure(figsize=(5.0 * len(curves), 3.6), dpi=110, layout="constrained")
    for axis, (title, key) in zip(fig.subplots(1, len(curves), squeeze=False)[0], curves.items()):
        points = [(row.get("step", i), row[key]) for i, row in enumerate(rows)
                  if isinstance(row.get(key), (int, float))]
        steps, values = (np.asarray(v, dtype=float) for v in zip(*points))
        window = smooth or max(1, len(values) // 20)
        axis.plot(steps, values, color="tab:blue", alpha=0.3, linewidth=1, label="logged")
        axis.plot(steps, _moving_average(values, window), color="tab:blue", linewidth=2,
                  label=f"moving average ({window})")
        axis.set(title=title, xlabel="iteration", ylabel=key)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.savefig(out_png)
    return out_png


def plot_metric_bars(metrics: Mapping[str, Mapping[str, Mapping]], out_png: str,
                     primary: Mapping[str, Sequence[str]] = PRIMARY) -> str:
    """Grouped bars: one panel per task, one group per headline metric, one bar per system.

    Args:
        metrics: system → task → metric name → Estimate (of that system's run).
    """
    systems = list(metrics)
    panels = [(task, [m for m in primary[task] if any(m in metrics[s].get(task, {}) for s in systems)])
              for task in TASKS]
    panels = [(task, names) for task, names in panels if names]
    if not panels:
        raise ValueError("plot_metric_bars: no headline metric in any run; evaluate at least one task first")
    fig = Figure(figsize=(max(4.0, 1.2 * len(systems) * sum(len(n) for _, n in panels) + 2), 3.8), dpi=110,
                 layout="constrained")
    width = 0.8 / len(systems)
    axes = fig.subplots(1, len(panels), squeeze=False, width_ratios=[len(n) + 1 for _, n in panels])[0]
    for axis, (task, names) in zip(axes, panels):
        for k, system in enumerate(systems):
            ests = [metrics[system].get(task, {}).get(name) for name in names]
            x = np.arange(len(names)) + (k - (len(systems) - 1) / 2) * width
            values = [np.nan if e is None else e.value for e in ests]
            errors = np.array([[0.0, 0.0] if e is None or np.isnan(e.low) else [e.value - e.low, e.high - e.value]
                               for e in ests]).T  # [2, M]
            axis.bar(x, values, width, yerr=errors, capsize=3, label=system, color=f"C{k}")
        axis.set_xticks(np.arange(len(names)), names, fontsize=8)
        axis.set_title(task)
        axis.set_ylim(0, 1)
        axis.grid(axis="y", alpha=0.3)
    handles, labels = axis.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(systems), 6), fontsize=8)
    fig.suptitle("held-out metrics (bars: estimate, whiskers: 95% bootstrap CI)", fontsize=10)
    fig.savefig(out_png)
    return out_png


def _edge(region: np.ndarray) -> np.ndarray:
    """Boundary pixels of a bool ``[H, W]`` region (about 1% of the image side thick)."""
    width = max(1, round(min(region.shape) / 100))
    return region & ~binary_erosion(region, iterations=width, border_value=0)


def overlay(image: np.ndarray, region: np.ndarray | None, colour: tuple[int, int, int],
            reference: np.ndarray | None = None, dim: float = 0.45) -> np.ndarray:
    """uint8 ``[H, W, 3]``: pixels outside ``region`` dimmed, its boundary drawn in ``colour``, and the
    boundary of ``reference`` (the GT, for comparison) in ``GT_COLOUR``. Dimming keeps the region readable
    whatever the colours of the scene; ``region=None`` (no mask) dims the whole image."""
    out = image.astype(np.float32)
    inside = np.zeros(image.shape[:2], dtype=bool) if region is None else region
    out[~inside] *= dim
    if reference is not None and reference.any():
        out[_edge(reference)] = GT_COLOUR
    if region is not None and region.any():
        out[_edge(region)] = colour
    return out.astype(np.uint8)


def display_text(text: str | None) -> str | None:
    """``text`` without template stop tokens (``DISPLAY_STRIPPED``), for figures; None stays None."""
    if text is None:
        return None
    for token in DISPLAY_STRIPPED:
        text = text.replace(token, "")
    return text.strip()


def _record_view(record: EvalRecord, gt_mask: np.ndarray) -> tuple[np.ndarray | None, str, str]:
    """(mask to draw, answer text, score line) of one system's record; answers as :func:`display_text` shows them."""
    record = replace(record, answer_a=display_text(record.answer_a), answer_b=display_text(record.answer_b),
                     caption=display_text(record.caption))
    pred = None
    if record.mask is not None and record.mask.rle is not None:
        h, w = record.mask.rle["size"]
        pred = decode_rle(record.mask.rle, h, w, file="records", sample_id=record.sample_id)
    elif record.mask is not None and record.mask.pred_area == 0:
        pred = np.zeros_like(gt_mask)  # an empty or missing prediction: nothing to outline
    score = f"{'IoU' if record.task in ('res', 'cycle_iou') else 'METEOR'} {record.score:.2f}"
    if record.mask is not None and not record.mask.has_mask:
        score += " · no [SEG]"
    if record.task == "res":
        return pred, record.answer_a, score
    if record.task == "caption":
        return gt_mask, f"“{record.caption}”", score
    if record.task == "cycle_iou":
        return pred, f"A: “{record.caption}”\nB: {record.answer_b or '—'}", score
    return pred, f"A: {record.answer_a}\nB: “{record.caption}”", score


def _wrap(text: str, width: int = 34, lines: int = 6, footer: str = "") -> str:
    """``text`` wrapped to ``width`` characters and cut to fit ``lines`` lines with an ellipsis; ``footer``
    (the score line) is wrapped too and always kept whole below it, so a long answer never hides the score."""
    def wrap(block: str) -> list[str]:
        return [line for part in block.split("\n") for line in (textwrap.wrap(part, width) or [""])]

    tail = wrap(footer) if footer else []
    body, room = wrap(text), max(1, lines - len(tail))
    if len(body) > room:
        body = body[:room - 1] + [body[room - 1][:width - 1] + "…"]
    return "\n".join(body + tail)


def plot_examples(task: str, samples: Sequence, records: Mapping[str, Mapping[str, EvalRecord]], out_png: str
                  ) -> str:
    """Rows = samples; columns = ground truth, then each system's prediction (mask overlay + text).

    Args:
        samples: the RegionSample rows to show.
        records: system → sample_id → that system's record of ``task``.
    """
    systems = list(records)
    fig = Figure(figsize=(2.9 * (1 + len(systems)), 3.9 * len(samples)), dpi=100, layout="constrained")
    axes = fig.subplots(len(samples), 1 + len(systems), squeeze=False)
    for row, sample in zip(axes, samples):
        image, gt_mask = np.asarray(sample.image.convert("RGB")), np.asarray(sample.gt_mask, dtype=bool)
        gt_text = (record_text_in(records, sample.sample_id) or (sample.captions or sample.expressions or [""])[0])
        row[0].imshow(overlay(image, gt_mask, GT_COLOUR), interpolation="nearest")
        row[0].set_title(f"ground truth\n{sample.sample_id}", fontsize=8)
        row[0].set_xlabel(_wrap(f"“{gt_text}”"), fontsize=8)
        for axis, system in zip(row[1:], systems):
            record = records[system].get(sample.sample_id)
            if record is None:
                raise ValueError(f"plot_examples: system {system!r} has no {task} record for {sample.sample_id!r}")
            pred, text, score = _record_view(record, gt_mask)
            shown = overlay(image, gt_mask, GT_COLOUR) if record.task == "caption" else \
                overlay(image, pred, PRED_COLOUR, reference=gt_mask)
            axis.imshow(shown, interpolation="nearest")
            if record.task != "caption" and (pred is None or not pred.any()):
                axis.text(0.5, 0.5, "no mask", transform=axis.transAxes, ha="center", va="center", fontsize=11,
                          color="white", bbox=dict(facecolor=np.array(PRED_COLOUR) / 255, alpha=0.85, pad=3))
            axis.set_title(system, fontsize=9)
            axis.set_xlabel(_wrap(text, footer=score), fontsize=8)
        for axis in row:
            axis.set_xticks([])
            axis.set_yticks([])
    what = "the region prompt is the ground truth" if task == "caption" else "magenta = predicted mask (outside dimmed)"
    fig.suptitle(f"{task}: cyan = ground-truth outline, {what}", fontsize=10)
    fig.savefig(out_png)
    return out_png


def record_text_in(records: Mapping[str, Mapping[str, EvalRecord]], sample_id: str) -> str | None:
    """The input text of a sample's records (expression / GT caption), if the task has one."""
    for by_id in records.values():
        record = by_id.get(sample_id)
        if record is not None and record.text_in:
            return record.text_in
    return None


def strip_frames(masks: np.ndarray | None, num_frames: int, max_frames: int) -> list[int]:
    """Up to ``max_frames`` frame indices spread evenly over the clip, always with the masklet's key frame (when it
    has a pixel), in time order."""
    if max_frames < 1:
        raise ValueError(f"plot_video_strip: max_frames={max_frames}; use >= 1")
    key = key_frame(masks) if masks is not None and masks.any() else None
    spread = {int(v) for v in np.rint(np.linspace(0, num_frames - 1, min(max_frames, num_frames)))}
    if key is not None and key not in spread:
        spread.remove(min(spread, key=lambda t: abs(t - key)))  # the nearest spread frame gives way to the key frame
        spread.add(key)
    return sorted(spread)


def plot_video_strip(sample, out_png: str, pred_masks: np.ndarray | None = None, max_frames: int = 8,
                     title: str | None = None) -> str:
    """One video sample as a strip: each shown frame with the ground-truth masklet outlined in cyan and the outside
    dimmed, the key frame (the masklet's largest, :func:`key_frame`) marked in its label; ``pred_masks`` bool
    ``[T, H, W]`` adds a row with the prediction in magenta over the ground-truth outline. The title is ``title`` or
    the sample id with its first caption and expression.

    Args:
        sample: a ``VideoRegionSample`` (a text-only sample, ``gt_masks=None``, shows the plain frames).
    """
    gt_masks = None if sample.gt_masks is None else np.asarray(sample.gt_masks, dtype=bool)
    shown = strip_frames(gt_masks, len(sample.frames), max_frames)
    key = key_frame(gt_masks) if gt_masks is not None and gt_masks.any() else None
    rows = 1 if pred_masks is None else 2
    fig = Figure(figsize=(1.9 * len(shown), 2.1 * rows + 0.7), dpi=100, layout="constrained")
    axes = fig.subplots(rows, len(shown), squeeze=False)
    for column, t in enumerate(shown):
        frame = np.asarray(sample.frames[t].convert("RGB"))
        gt = None if gt_masks is None else gt_masks[t]
        axes[0, column].imshow(frame if gt is None else overlay(frame, gt, GT_COLOUR), interpolation="nearest")
        label = sample.frame_names[t] if t < len(sample.frame_names) else str(t)
        axes[0, column].set_title(f"{label}{' (key)' if t == key else ''}", fontsize=8)
        if pred_masks is not None:
            axes[1, column].imshow(overlay(frame, np.asarray(pred_masks[t], dtype=bool), PRED_COLOUR, reference=gt),
                                   interpolation="nearest")
    for axis in axes.ravel():
        axis.set_xticks([])
        axis.set_yticks([])
    axes[0, 0].set_ylabel("ground truth", fontsize=8)
    if pred_masks is not None:
        axes[1, 0].set_ylabel("prediction", fontsize=8)
    texts = [f"“{t}”" for t in (sample.captions[:1] + sample.expressions[:1])]
    fig.suptitle(title or _wrap(" · ".join([sample.sample_id, *texts]), width=40 * len(shown) // 2, lines=2),
                 fontsize=9)
    fig.savefig(out_png)
    return out_png
