"""Held-out segmentation quality of a checkpoint with the default prompt (the segmenter's own report card)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..model.pipeline.inference import predict_batch
from ..model.text.prompts import RES_EVAL_PROMPT, normalize_expression
from ..rewards.mask_metrics import ciou_giou, mask_metrics
from .prompts import DEFAULT_PROMPT_SPECS, candidate_expressions
from .segment import SegmentRows, segment_rows


def _mean(values: Sequence[float]) -> float:
    return round(float(np.mean(values)), 4)


def text_sensitivity(model, processor, world, *, chunk_size: int = 32) -> dict:
    """Does the text pick the object? On the multi-object scenes of a ``ShapesWorld``, Dice with the target of the
    mask for the target's canonical caption vs the mask for another object's caption. A text-blind model (one that
    segments the most salient object whatever it is asked) scores the same on both."""
    from ..data.shapes_scene import canonical_caption

    images, rows, targets = [], [], []
    for index in range(len(world)):
        scene, _ = world.scene(index)
        if len(scene.objects) < 2:
            continue
        other = (scene.target + 1) % len(scene.objects)
        images.append(world[index].image)
        for obj in (scene.target, other):
            rows.append((len(images) - 1, canonical_caption(scene.attrs[obj])))
        targets.append(scene.visible[scene.target])
    if not images:
        return {"num_scenes": 0}
    out = segment_rows(model, processor, images, SegmentRows([i for i, _ in rows], [t for _, t in rows],
                                                            [None] * len(rows)), chunk_size=chunk_size)
    own = [float(mask_metrics(out.pred_masks[2 * j], t)["dice"][0]) for j, t in enumerate(targets)]
    other = [float(mask_metrics(out.pred_masks[2 * j + 1], t)["dice"][0]) for j, t in enumerate(targets)]
    return {"num_scenes": len(images), "dice_target_prompt": _mean(own), "dice_distractor_prompt": _mean(other)}


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
