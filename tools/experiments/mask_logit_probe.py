"""Experiment (docs/demo.md, "Session 7"): how did GRPO change the segmenter's masks, start vs RL checkpoint?

On held-out shapes scenes, each model answers the RES prompt of the sample's first referring expression (greedy, the
evaluation's pipeline) and the SAM2 decoder's best low-res logits z ``[h, w]`` of the first ``[SEG]`` are kept.
Printed per model: mean |z| (confidence), the share of low-res cells with |z| < 2 (where a tau = 1 draw flips with
p > 0.12), the mean Bernoulli entropy per cell and the greedy gIoU; then how many greedy masks changed and the mean
share of their pixels that changed.

    python -m tools.experiments.mask_logit_probe START_CHECKPOINT RL_CHECKPOINT [--num-samples 200]

Run it from the repository root (``python -m`` puts the root on the import path).
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from torch.distributions import Bernoulli

from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.evaluation.loading import load_system
from projects.llava_sam2.rl_train.model.pipeline.shared import PromptRow, encode_images, greedy_answers
from projects.llava_sam2.rl_train.rewards.mask_metrics import mask_metrics


def first_seg_logits(checkpoint: str, samples: list, batch: int = 16) -> list[tuple]:
    """Per sample (best low-res logits ``[h, w]``, greedy bool mask ``[H, W]``), or (None, None) without ``[SEG]``."""
    model, processor, _ = load_system(checkpoint=checkpoint)
    captured = []
    decode_masks = model.decode_masks

    def recording(*args, **kwargs):  # the pipeline decodes every kept [SEG] in one call per chunk
        out = decode_masks(*args, **kwargs)
        captured.append(out.best_logits.detach().float().cpu())
        return out

    model.decode_masks = recording
    results = []
    for b0 in range(0, len(samples), batch):
        chunk = samples[b0:b0 + batch]
        encoded = encode_images(model, processor, [s.image for s in chunk], [s.sample_id for s in chunk])
        rows = [PromptRow(i, processor.segment_prompt(encoded.n_tiles(i), s.expressions[0]))
                for i, s in enumerate(chunk)]
        captured.clear()
        answers = greedy_answers(model, processor, encoded, rows, max_new_tokens=24, seg_masks="first")
        logits = iter(torch.cat(captured)) if captured else iter(())
        results += [(next(logits), a.seg_masks[0]) if a.seg_masks else (None, None) for a in answers]
    return results


def summary(results: list[tuple], samples: list) -> dict:
    z = torch.stack([r[0] for r in results if r[0] is not None])  # [n, h, w]
    ious = [mask_metrics(m, s.gt_mask)["iou"].item() if m is not None else 0.0  # no [SEG]: IoU 0, as the evaluation
            for (_, m), s in zip(results, samples)]
    return {"with_seg": len(z), "mean_abs_logit": z.abs().mean().item(),
            "share_cells_abs_logit_below_2": (z.abs() < 2).float().mean().item(),
            "mean_cell_entropy_nats": Bernoulli(logits=z).entropy().mean().item(), "greedy_giou": float(np.mean(ious))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("start", help="HF-layout checkpoint before GRPO")
    parser.add_argument("rl", help="HF-layout checkpoint after GRPO")
    parser.add_argument("--num-samples", type=int, default=200)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--data-seed", type=int, default=0)
    args = parser.parse_args(argv)
    world = ShapesWorld("val", args.num_samples, args.data_seed, image_size=args.image_size)
    samples = [world.load(i) for i in range(len(world))]
    start, rl = first_seg_logits(args.start, samples), first_seg_logits(args.rl, samples)
    pairs = [(a, b) for (_, a), (_, b) in zip(start, rl) if a is not None and b is not None]
    changed = [float((np.asarray(a) != np.asarray(b)).mean()) for a, b in pairs]
    report = {"start": summary(start, samples), "rl": summary(rl, samples),
              "greedy_masks_changed": float(np.mean([c > 0 for c in changed])),
              "mean_share_of_pixels_changed": float(np.mean(changed))}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
