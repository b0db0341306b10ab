"""Does the segmenter read its text? Own-object against other-text IoU on held-out multi-object scenes (issue #12).

For a held-out scene s with objects k = 1..n_s (n_s ≥ 2), the model segments each object's text t_k with the RES
prompt (greedy answer, first ``[SEG]`` mask, exactly as the ``res`` evaluation task does); m_k is that mask and g_k
the object's visible GT mask. Per scene::

    own_s     = mean_k IoU(m_k, g_k)                      mask for object k's text vs object k
    other_s   = mean_k mean_{j≠k} IoU(m_j, g_k)           masks for the other objects' texts vs object k
    same_s    = #{j < k : m_j == m_k pixel for pixel}     identical masks for different texts
    pairs_s   = n_s (n_s − 1) / 2

Reported over S scenes (scene = resampling unit, percentile bootstrap, ``evaluation/bootstrap.py``): own IoU =
mean_s own_s, other-text IoU = mean_s other_s, gap = mean_s (own_s − other_s) (paired), identical pairs =
Σ same_s / Σ pairs_s. A text-blind segmenter (the same mask whatever the text) has gap 0 and 100 % identical
pairs; an oracle that returns each named object's GT has own 1, other 0 (the visible masks of a scene do not
overlap). Issue #12's targets: gap ≥ 0.30 and < 20 % identical pairs. An answer without ``[SEG]`` gives an empty
mask (IoU 0), as in the ``res`` task.

Scenes: ``ShapesWorld(split, seed=seed, domain=domain, shift=shift)`` (``'val'`` for choosing settings, ``'test'``
for reporting; both held out from training), walked from index 0, keeping the first ``num_scenes`` with two objects
or more. Text per object: its first referring
expression (the shortest phrase that identifies it, the ``res`` task's choice) or its canonical caption.

Two systems on the same scenes (e.g. a model before and after RL) are compared scene by scene
(:func:`compare`): Δ own, Δ other, Δ gap = mean_s [(own_s − other_s)_B − (own_s − other_s)_A] and Δ identical
pairs = Σ same_B / Σ pairs − Σ same_A / Σ pairs, each with a paired bootstrap CI over scenes.

    python -m projects.llava_sam2.rl_train.evaluation.text_dependence --checkpoint DIR --scenes 200 \
        [--image-size 128] [--device cuda] [--json F]      # the JSON keeps the per-scene columns for compare()
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .bootstrap import Estimate, bootstrap_mean, bootstrap_ratio, paired_difference, paired_ratio_difference

TEXT_SOURCES = ("expression", "caption")
GAP_TARGET = 0.30
IDENTICAL_TARGET = 0.20
# (images, texts per image) -> one bool [H, W] mask (or None: no [SEG]) per text of each image
SegmentFn = Callable[[Sequence, Sequence[Sequence[str]]], list[list]]


@dataclass(frozen=True)
class HeldOutScene:
    """One held-out scene: the PIL image, one text per object and the objects' visible masks ``[H, W]``."""

    index: int
    image: object
    texts: list[str]
    gt_masks: list[np.ndarray]


@dataclass(frozen=True)
class SceneScore:
    """The per-scene columns of the module docstring."""

    own: float
    other: float
    identical_pairs: int
    pairs: int
    objects: int


@dataclass(frozen=True)
class TextDependence:
    """The text-dependence measure with 95 % bootstrap CIs (see the module docstring)."""

    own_iou: Estimate
    other_iou: Estimate
    gap: Estimate
    identical_share: Estimate
    num_scenes: int
    num_objects: int
    num_pairs: int
    scenes: tuple[SceneScore, ...] = ()
    scene_indices: tuple[int, ...] = ()

    @property
    def meets_targets(self) -> bool:
        """Issue #12's acceptance: gap ≥ 0.30 and identical pairs < 20 %."""
        return self.gap.value >= GAP_TARGET and self.identical_share.value < IDENTICAL_TARGET

    def to_dict(self) -> dict:
        out = {name: getattr(self, name).to_dict() for name in ("own_iou", "other_iou", "gap", "identical_share")}
        scenes = [{"index": i, **asdict(score)} for i, score in zip(self.scene_indices, self.scenes)]
        return {**out, "num_scenes": self.num_scenes, "num_objects": self.num_objects, "num_pairs": self.num_pairs,
                "meets_targets": self.meets_targets, "scenes": scenes}

    def format(self) -> str:
        return (f"text dependence on {self.num_scenes} held-out scenes ({self.num_objects} objects, {self.num_pairs} "
                f"pairs): own IoU {self.own_iou.format()}, other-text IoU {self.other_iou.format()}, gap "
                f"{self.gap.format()} (target >= {GAP_TARGET}), identical pairs "
                f"{self.identical_share.format(1, 100)} % "
                f"(target < {IDENTICAL_TARGET * 100:.0f} %)")


def iou(pred_mask: np.ndarray, gt_mask: np.ndarray) -> float:
    """|P ∩ G| / |P ∪ G|, 1.0 when both are empty."""
    union = np.logical_or(pred_mask, gt_mask).sum()
    return float(np.logical_and(pred_mask, gt_mask).sum() / union) if union else 1.0


def score_scene(pred_masks: Sequence[np.ndarray | None], gt_masks: Sequence[np.ndarray]) -> SceneScore:
    """Per-scene columns from the masks for each object's text (None = no ``[SEG]``: an empty mask)."""
    n = len(gt_masks)
    if n < 2 or len(pred_masks) != n:
        raise ValueError(f"score_scene: need >= 2 objects and one predicted mask per object, got {len(pred_masks)} "
                         f"masks for {n} objects")
    pred = [np.zeros_like(g, dtype=bool) if m is None else np.asarray(m, dtype=bool)
            for m, g in zip(pred_masks, gt_masks)]
    own = [iou(pred[k], gt_masks[k]) for k in range(n)]
    other = [np.mean([iou(pred[j], gt_masks[k]) for j in range(n) if j != k]) for k in range(n)]
    same = sum(bool(np.array_equal(pred[j], pred[k])) for j in range(n) for k in range(j + 1, n))
    return SceneScore(float(np.mean(own)), float(np.mean(other)), same, n * (n - 1) // 2, n)


def summarize(scores: Sequence[SceneScore], *, n_resamples: int = 1000, confidence: float = 0.95,
              seed: int = 0, indices: Sequence[int] = ()) -> TextDependence:
    """Bootstrap CIs over scenes (module docstring); ``indices``: the scenes' indices in the held-out stream."""
    if not scores:
        raise ValueError("text dependence: no held-out scene with >= 2 objects was scored")
    knobs = dict(n_resamples=n_resamples, confidence=confidence, seed=seed)
    own, other = [s.own for s in scores], [s.other for s in scores]
    same, pairs = [s.identical_pairs for s in scores], [s.pairs for s in scores]
    return TextDependence(
        own_iou=bootstrap_mean(own, what="own IoU", **knobs),
        other_iou=bootstrap_mean(other, what="other IoU", **knobs),
        gap=paired_difference(own, other, what="own - other IoU", **knobs),
        identical_share=bootstrap_ratio(same, pairs, what="identical pairs", **knobs),
        num_scenes=len(scores), num_objects=sum(s.objects for s in scores),
        num_pairs=int(sum(pairs)), scenes=tuple(scores), scene_indices=tuple(int(i) for i in indices))


def held_out_scenes(num_scenes: int, *, seed: int = 0, text_source: str = "expression",
                    image_size: int = 224, split: str = "val", domain: str = "source",
                    shift: float = 1.0) -> list[HeldOutScene]:
    """The first ``num_scenes`` scenes with >= 2 objects of ``ShapesWorld(split, seed=seed, domain=domain)``."""
    from PIL import Image

    from ..data.shapes import ShapesWorld
    from ..data.shapes_scene import canonical_caption, referring_expressions

    if text_source not in TEXT_SOURCES:
        raise ValueError(f"text_source={text_source!r}: expected one of {TEXT_SOURCES}")
    if num_scenes < 1:
        raise ValueError(f"num_scenes={num_scenes}: expected >= 1 (the issue's measure uses >= 200)")
    world = ShapesWorld(split, 100 * num_scenes, seed, image_size=image_size, domain=domain, shift=shift)
    scenes = []
    for index in range(len(world)):
        scene, pixels = world.scene(index)
        if len(scene.objects) < 2:
            continue
        texts = [referring_expressions(scene, k)[0] if text_source == "expression" else canonical_caption(attrs)
                 for k, attrs in enumerate(scene.attrs)]
        scenes.append(HeldOutScene(index, Image.fromarray(pixels), texts, [m.copy() for m in scene.visible]))
        if len(scenes) == num_scenes:
            break
    return scenes


def measure(segment: SegmentFn, scenes: Sequence[HeldOutScene], *, batch_size: int = 16,
            n_resamples: int = 1000, seed: int = 0) -> TextDependence:
    """Score ``segment`` (images, texts per image -> masks per text) on ``scenes``, ``batch_size`` images a call."""
    scores = []
    for start in range(0, len(scenes), batch_size):
        chunk = scenes[start:start + batch_size]
        masks = segment([s.image for s in chunk], [s.texts for s in chunk])
        if len(masks) != len(chunk) or any(len(m) != len(s.texts) for m, s in zip(masks, chunk)):
            raise ValueError("text dependence: the segmenter must return one mask per text of each image")
        scores += [score_scene(m, s.gt_masks) for m, s in zip(masks, chunk)]
    return summarize(scores, n_resamples=n_resamples, seed=seed, indices=[s.index for s in scenes])


@dataclass(frozen=True)
class TextDependenceChange:
    """System B − system A on the same scenes, paired bootstrap 95 % CIs (module docstring)."""

    own_iou: Estimate
    other_iou: Estimate
    gap: Estimate
    identical_share: Estimate
    num_scenes: int

    def to_dict(self) -> dict:
        out = {name: getattr(self, name).to_dict() for name in ("own_iou", "other_iou", "gap", "identical_share")}
        return {**out, "num_scenes": self.num_scenes}


def _scene_columns(result: Mapping) -> tuple[list[int], dict[str, list[float]]]:
    scenes = result.get("scenes")
    if not scenes:
        raise ValueError("text dependence: the result has no per-scene columns ('scenes'); measure it again with "
                         "this version (its --json keeps them)")
    columns = {key: [float(row[key]) for row in scenes] for key in ("own", "other", "identical_pairs", "pairs")}
    return [int(row["index"]) for row in scenes], columns


def compare(result_a: Mapping, result_b: Mapping, *, n_resamples: int = 1000, seed: int = 0) -> TextDependenceChange:
    """B − A for two :meth:`TextDependence.to_dict` results (or their JSON files' contents) on the same scenes."""
    index_a, a = _scene_columns(result_a)
    index_b, b = _scene_columns(result_b)
    if index_a != index_b:
        raise ValueError(f"text dependence: the two results scored different scenes ({len(index_a)} vs "
                         f"{len(index_b)}, first {index_a[:3]} vs {index_b[:3]}); measure both with the same "
                         "--scenes / --seed")
    knobs = dict(n_resamples=n_resamples, seed=seed)
    gap_a = [o - t for o, t in zip(a["own"], a["other"])]
    gap_b = [o - t for o, t in zip(b["own"], b["other"])]
    return TextDependenceChange(
        own_iou=paired_difference(b["own"], a["own"], what="Δ own IoU", **knobs),
        other_iou=paired_difference(b["other"], a["other"], what="Δ other IoU", **knobs),
        gap=paired_difference(gap_b, gap_a, what="Δ gap", **knobs),
        identical_share=paired_ratio_difference(b["identical_pairs"], b["pairs"], a["identical_pairs"], a["pairs"],
                                                what="Δ identical pairs", **knobs),
        num_scenes=len(index_a))


def model_segmenter(model, processor, *, max_new_tokens: int = 64) -> SegmentFn:
    """The ``res`` task's segmentation (RES eval prompt, greedy, first ``[SEG]``) as a :data:`SegmentFn`, through
    the shared model pipeline (``model/pipeline/shared.py``)."""
    from ..model.pipeline.shared import PromptRow, encode_images, greedy_answers

    def segment(images: Sequence, texts: Sequence[Sequence[str]]) -> list[list]:
        encoded = encode_images(model, processor, list(images), [f"held-out image {i}" for i in range(len(images))])
        rows = [PromptRow(i, processor.segment_prompt(encoded.n_tiles(i), text)) for i, row in enumerate(texts)
                for text in row]
        answers = iter(greedy_answers(model, processor, encoded, rows, max_new_tokens=max_new_tokens,
                                      seg_masks="first"))
        return [[_first_mask(next(answers)) for _ in row] for row in texts]

    return segment


def _first_mask(answer) -> np.ndarray | None:
    """The answer's first ``[SEG]`` mask as a bool array, None without one."""
    return answer.seg_masks[0].numpy() if answer.seg_masks else None


def text_dependence(model, processor, *, num_scenes: int = 200, seed: int = 0, text_source: str = "expression",
                    image_size: int | None = None, batch_size: int = 16, max_new_tokens: int = 64,
                    n_resamples: int = 1000, split: str = "val", domain: str = "source",
                    shift: float = 1.0) -> TextDependence:
    """The measure of the module docstring for a Sa2VA model on ``num_scenes`` held-out scenes rendered at
    ``image_size`` pixels (None: the model's tile size, 224 for the tiny preset; the demo renders 128)."""
    image_size = image_size or processor.tiling.image_size
    scenes = held_out_scenes(num_scenes, seed=seed, text_source=text_source, image_size=image_size, split=split,
                             domain=domain, shift=shift)
    return measure(model_segmenter(model, processor, max_new_tokens=max_new_tokens), scenes,
                   batch_size=batch_size, n_resamples=n_resamples)


def add_world_arguments(parser: argparse.ArgumentParser) -> None:
    """--seed, --split, --domain, --shift: which held-out shapes scenes are scored."""
    parser.add_argument("--seed", type=int, default=0, help="ShapesWorld seed (the demo's held-out data: 0)")
    parser.add_argument("--split", choices=("val", "test"), default="val",
                        help="held-out split: val for choosing settings, test for reporting")
    parser.add_argument("--domain", choices=("source", "target"), default="source", help="shapes world domain")
    parser.add_argument("--shift", type=float, default=1.0, help="target domain's pixel-shift strength")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="HF-layout Sa2VA checkpoint directory (with its tokenizer)")
    parser.add_argument("--scenes", type=int, default=200, help="held-out scenes with >= 2 objects to score")
    add_world_arguments(parser)
    parser.add_argument("--text-source", choices=TEXT_SOURCES, default="expression",
                        help="object text: first referring expression (as the res task) or canonical caption")
    parser.add_argument("--image-size", type=int, default=None,
                        help="side of the rendered scenes (default: the model's tile size; the demo uses 128)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--batch-size", type=int, default=16, help="scenes per model call")
    parser.add_argument("--json", default=None, help="write the result here as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .loading import load_system

    model, processor, _ = load_system(checkpoint=args.checkpoint, device=args.device)
    result = text_dependence(model, processor, num_scenes=args.scenes, seed=args.seed, text_source=args.text_source,
                             image_size=args.image_size, batch_size=args.batch_size, split=args.split,
                             domain=args.domain, shift=args.shift)
    print(result.format())
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"checkpoint": args.checkpoint, "scenes": args.scenes, "seed": args.seed, "split": args.split,
                       "domain": args.domain, "shift": args.shift,
                       "text_source": args.text_source, "image_size": args.image_size or processor.tiling.image_size,
                       **result.to_dict()}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
