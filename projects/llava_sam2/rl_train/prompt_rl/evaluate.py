"""Held-out segmentation quality of a checkpoint with the default prompt (the segmenter's own report card)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..model.inference import predict_batch
from ..model.prompts import RES_EVAL_PROMPT, normalize_expression
from ..rewards.mask_metrics import ciou_giou, mask_metrics
from .prompts import DEFAULT_PROMPT_SPECS, candidate_expressions
from .segment import SegmentRows, segment_rows


def _mean(values: Sequence[float]) -> float:
    return round(float(np.mean(values)), 4)


def evaluate_default_prompt(model, processor, dataset, *, greedy_samples: int = 16, chunk_size: int = 32) -> dict:
    """Teacher-forced default-prompt masks on every sample of ``dataset`` (mean IoU/Dice, cIoU/gIoU), plus a greedy
    check on the first ``greedy_samples``: how often ``predict`` emits a usable ``[SEG]`` and the IoU it gets."""
    samples = [dataset[i] for i in range(len(dataset))]
    spec = DEFAULT_PROMPT_SPECS[0]
    expressions = [candidate_expressions(s.expressions, [spec], s.sample_id)[0] for s in samples]
    rows = SegmentRows(list(range(len(samples))), expressions, [spec.question] * len(samples))
    out = segment_rows(model, processor, [s.image for s in samples], rows, chunk_size=chunk_size)
    gts = [np.asarray(s.gt_mask, dtype=bool) for s in samples]
    per = [mask_metrics(p, g) for p, g in zip(out.pred_masks, gts)]
    result = {"num_samples": len(samples), "mean_iou": _mean([float(m["iou"][0]) for m in per]),
              "mean_dice": _mean([float(m["dice"][0]) for m in per]),
              **{k: round(v, 4) for k, v in ciou_giou(out.pred_masks, gts).items() if k != "count"},
              "mean_pred_iou_head": _mean(out.pred_iou.tolist())}
    n = min(greedy_samples, len(samples))
    if n:
        texts = [RES_EVAL_PROMPT.format(sent=normalize_expression(s.expressions[0])) for s in samples[:n]]
        answers = predict_batch(model, processor, [s.image for s in samples[:n]], texts, max_new_tokens=16)
        with_mask = [(a["prediction_masks"][0], g) for a, g in zip(answers, gts[:n]) if a["prediction_masks"]]
        result["greedy"] = {"num_samples": n, "seg_rate": round(len(with_mask) / n, 4),
                            "mean_iou_when_seg": _mean([float(mask_metrics(p, g)["iou"][0]) for p, g in with_mask])
                            if with_mask else None,
                            "example_answer": answers[0]["prediction"]}
    return result
