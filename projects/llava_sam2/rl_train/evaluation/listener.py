"""Listener accuracy: do a system's captions pick out the right object for a frozen listener? (issue #23)

METEOR against the ground truth flatters a caption that names the wrong object (most of its words are right), and
the cycle IoU lets a system's own segmenter adapt to its captions. Listener accuracy asks a fixed reader instead:
on held-out scenes with two objects or more, the system captions each object k (region prompt on its visible mask,
greedy, the ``caption`` task's prompt); a *frozen listener* (the starting model, never trained) segments that
caption (RES prompt, greedy, first ``[SEG]``, as the ``res`` task) into m_k. The caption is **correct** when

    IoU(m_k, g_k) > 0.5   and   IoU(m_k, g_k) > IoU(m_k, g_j) for every other object j of the scene,

i.e. the listener found object k and no other. Accuracy = Σ correct / Σ objects over the scenes, with a percentile
bootstrap CI over scenes; two systems on the same scenes are compared scene by scene (:func:`compare`).

Scenes are ``text_dependence.held_out_scenes`` (the first ``num_scenes`` multi-object scenes of a held-out split).

    python -m projects.llava_sam2.rl_train.evaluation.listener --checkpoint SYSTEM --listener START \\
        --scenes 200 --split test --domain target --image-size 128 --json OUT.json
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .bootstrap import Estimate, bootstrap_ratio, paired_ratio_difference
from .text_dependence import HeldOutScene, add_world_arguments, held_out_scenes, iou

IOU_THRESHOLD = 0.5


def object_is_found(pred_mask: np.ndarray | None, gt_masks: Sequence[np.ndarray], k: int) -> bool:
    """The listener's mask for object k's caption overlaps k at IoU > 0.5 and more than any other object."""
    if pred_mask is None or not np.asarray(pred_mask).any():
        return False
    scores = [iou(np.asarray(pred_mask, dtype=bool), g) for g in gt_masks]
    return scores[k] > IOU_THRESHOLD and all(scores[k] > s for j, s in enumerate(scores) if j != k)


@dataclass(frozen=True)
class ListenerAccuracy:
    """Accuracy with its CI and the per-scene counts (for :func:`compare`)."""

    accuracy: Estimate
    correct: tuple[int, ...]
    objects: tuple[int, ...]
    scene_indices: tuple[int, ...]
    captions: tuple[tuple[str, ...], ...] = ()

    def to_dict(self) -> dict:
        return {"accuracy": self.accuracy.to_dict(), "num_scenes": len(self.correct),
                "num_objects": int(sum(self.objects)),
                "scenes": [{"index": i, "correct": c, "objects": n, "captions": list(t)}
                           for i, c, n, t in zip(self.scene_indices, self.correct, self.objects,
                                                 self.captions or [()] * len(self.correct))]}

    def format(self) -> str:
        return (f"listener accuracy on {len(self.correct)} held-out scenes ({sum(self.objects)} objects): "
                f"{self.accuracy.format()}")


def score(captions_of, segment, scenes: Sequence[HeldOutScene], *, batch_size: int = 16, n_resamples: int = 1000,
          seed: int = 0) -> ListenerAccuracy:
    """``captions_of(images, masks per image) -> captions per image`` (the system) and ``segment(images, texts per
    image) -> masks per text`` (the listener) on ``scenes``."""
    correct, objects, captions = [], [], []
    for start in range(0, len(scenes), batch_size):
        chunk = scenes[start:start + batch_size]
        texts = captions_of([s.image for s in chunk], [s.gt_masks for s in chunk])
        masks = segment([s.image for s in chunk], texts)
        for scene, scene_texts, scene_masks in zip(chunk, texts, masks):
            found = [bool(t.strip()) and object_is_found(m, scene.gt_masks, k)
                     for k, (t, m) in enumerate(zip(scene_texts, scene_masks))]
            correct.append(int(sum(found)))
            objects.append(len(scene.gt_masks))
            captions.append(tuple(scene_texts))
    if not objects:
        raise ValueError("listener accuracy: no held-out scene with >= 2 objects was scored")
    accuracy = bootstrap_ratio(correct, objects, what="listener accuracy", n_resamples=n_resamples, seed=seed)
    return ListenerAccuracy(accuracy, tuple(correct), tuple(objects), tuple(s.index for s in scenes),
                            tuple(captions))


def compare(result_a: Mapping, result_b: Mapping, *, n_resamples: int = 1000, seed: int = 0) -> Estimate:
    """B − A accuracy for two :meth:`ListenerAccuracy.to_dict` results on the same scenes (paired over scenes)."""
    index_a = [row["index"] for row in result_a["scenes"]]
    index_b = [row["index"] for row in result_b["scenes"]]
    if index_a != index_b:
        raise ValueError(f"listener accuracy: the two results scored different scenes ({len(index_a)} vs "
                         f"{len(index_b)}); measure both with the same --scenes / --split / --seed")

    def column(result, key):
        return [float(row[key]) for row in result["scenes"]]

    return paired_ratio_difference(column(result_b, "correct"), column(result_b, "objects"),
                                   column(result_a, "correct"), column(result_a, "objects"),
                                   what="Δ listener accuracy", n_resamples=n_resamples, seed=seed)


def model_captioner(model, processor, *, max_new_tokens: int = 24):
    """The ``caption`` task's greedy region caption of every mask, as the partner is given it (``Answer.plain``)."""
    from ..model.pipeline.shared import PromptRow, encode_images, greedy_answers

    def captions_of(images: Sequence, masks: Sequence[Sequence[np.ndarray]]) -> list[list[str]]:
        encoded = encode_images(model, processor, list(images), [f"held-out image {i}" for i in range(len(images))])
        rows = []
        for i, scene_masks in enumerate(masks):
            for k, mask in enumerate(scene_masks):
                cells = processor.region_cells(mask, sample_id=f"held-out image {i} object {k}",
                                               size=encoded.image_sizes[i], empty_region="dilate_to_one_cell")
                rows.append(PromptRow(i, processor.caption_prompt(encoded.n_tiles(i), cells), cells))
        answers = iter(greedy_answers(model, processor, encoded, rows, max_new_tokens=max_new_tokens))
        return [[next(answers).plain for _ in scene_masks] for scene_masks in masks]

    return captions_of


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="the system whose captions are scored (HF layout)")
    parser.add_argument("--listener", required=True, help="the frozen listener (HF layout; the starting model)")
    parser.add_argument("--scenes", type=int, default=200, help="held-out scenes with >= 2 objects")
    add_world_arguments(parser)
    parser.add_argument("--image-size", type=int, default=128, help="side of the rendered scenes")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=16, help="scenes per model call")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="longest caption / listener answer")
    parser.add_argument("--json", default=None, help="write the result here as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .loading import load_system
    from .text_dependence import model_segmenter

    system, system_processor, _ = load_system(checkpoint=args.checkpoint, device=args.device)
    if Path(args.listener).resolve() == Path(args.checkpoint).resolve():
        listener, listener_processor = system, system_processor
    else:
        listener, listener_processor, _ = load_system(checkpoint=args.listener, device=args.device)
    scenes = held_out_scenes(args.scenes, seed=args.seed, image_size=args.image_size, split=args.split,
                             domain=args.domain, shift=args.shift)
    result = score(model_captioner(system, system_processor, max_new_tokens=args.max_new_tokens),
                   model_segmenter(listener, listener_processor, max_new_tokens=args.max_new_tokens), scenes,
                   batch_size=args.batch_size)
    print(result.format())
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"checkpoint": args.checkpoint, "listener": args.listener, "split": args.split,
                       "domain": args.domain, "shift": args.shift, "seed": args.seed, **result.to_dict()},
                      handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
