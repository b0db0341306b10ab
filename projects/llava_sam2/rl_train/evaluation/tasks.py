"""Held-out evaluation tasks over ``RegionSample`` data, greedy and batched.

Four tasks (``TASKS``), each producing one :class:`~.records.EvalRecord` per sample:

* ``res`` (partner-free referring segmentation): RES prompt with the sample's expression → greedy
  answer → ``[SEG]`` mask → IoU vs gt_mask; cIoU / gIoU as Sa2VA (``metrics`` module doc).
* ``caption`` (partner-free region captioning): region prompt on gt_mask → greedy caption → cleaned
  → nltk METEOR vs the sample's captions (optionally METEOR 1.5 via the jar, reported apart).
  ``EvalConfig.region_input`` picks how every region is shown (the caption and both cycle tasks): region tokens
  (``'native'``) or drawn into a copy of the image (``'drawn'``, region_tokens 0 in the records).
* ``cycle_iou`` (Loop 1): gt_mask → caption (model A) → mask' (model B) → IoU(gt_mask, mask').
* ``cycle_caption`` (Loop 2): gt caption → mask (model A) → caption' (model B) → METEOR(caption', gt).

Every answer is ``model.pipeline.shared.greedy_answers``; the cycle's two partner tasks are the pipeline's
``segment_texts`` and ``describe_masks``, the code the training loops' partner runs (grpo/passes.py),
with the same conventions: B is given A's caption as plain text (``Answer.plain``:
stop words and tags removed); an empty caption or an answer without ``[SEG]`` gives an empty mask
(IoU 0); an empty mask gives the caption "" (METEOR 0); a non-empty mask that hits no region-grid
point is shown as the one cell it covers most (``empty_region='dilate_to_one_cell'``).

The frozen encoders run once per image per batch and model (model B reuses A's features when it is
the same object); all requested tasks share one pass over the data.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from tqdm.auto import tqdm

from ..data.bad_samples import SkippedSample
from ..model.pipeline.shared import Answer, RegionAnswer, describe_masks, encode_images, segment_texts
from ..model.text.drawn_region import check_region_input
from ..model.text.processor import EMPTY_REGION_POLICIES
from .bootstrap import Estimate
from .captions import CAPTION_CLEANERS, get_cleaner, meteor15_scores, meteor_per_caption
from .metrics import TASKS, summarize
from .records import EvalRecord, MaskStats

TEXT_SOURCES = ("expression", "caption")
# multi_seg -> the [SEG] masks an answer keeps (model.pipeline.shared.SEG_MASK_RULES); its mask is their union
MULTI_SEG_RULES = {"first": "first", "union": "all"}
logger = logging.getLogger(__name__)


@dataclass
class EvalConfig:
    """Knobs of the held-out evaluation."""

    # decoding
    batch_size: int = 8
    """samples per model call (B prompt rows)."""
    max_new_tokens: int = 64
    """greedy answer cap (HF predict_forward uses 2048; short answers need far fewer)."""
    multi_seg: str = "first"
    """mask of an answer with several [SEG]: 'first' (original Sa2VA RefCOCO eval) or 'union' (newer eval)."""
    video_mllm_frames: int = 5
    """video tasks: frames of each clip the language model sees (upstream: the first 5)."""
    # prompts
    segment_question: str | None = None
    """RES question template with '{class_name}'; None: Sa2VA's RES eval prompt."""
    caption_question: str | None = None
    """region-caption question; None: Sa2VA's RefCOCOg region-caption eval prompt."""
    text_source: str = "expression"
    """text of the res task: 'expression' (first expression, else first caption) or 'caption' (the reverse)."""
    empty_region: str = "dilate_to_one_cell"
    """gt_mask that hits no region-grid point: see Sa2VAProcessor ('keep' needs a 'keep' processor)."""
    region_input: str | None = None
    """region input of the caption / cycle tasks: 'native' (region tokens), 'drawn' (the region drawn into a copy of
    the image; ``caption_question`` must then name the outline) or None (the model family's own)."""
    # scoring
    caption_cleaning: str = "sa2va"
    """'sa2va' (upstream region-caption cleaning) or 'tags' (tags only); see captions.py."""
    use_meteor15: bool = False
    """also score captions with METEOR 1.5 (Java jar, ~10 s start-up)."""
    keep_masks: bool = True
    """store predicted masks as COCO RLE in the records (for example figures)."""
    # confidence intervals
    n_resamples: int = 1000
    """bootstrap replicates."""
    confidence: float = 0.95
    """CI level."""
    seed: int = 0
    """bootstrap seed."""
    show_progress: bool = True
    """tqdm progress bar."""

    def __post_init__(self) -> None:
        choices = {"multi_seg": tuple(MULTI_SEG_RULES), "text_source": TEXT_SOURCES,
                   "empty_region": EMPTY_REGION_POLICIES, "caption_cleaning": tuple(CAPTION_CLEANERS)}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"EvalConfig.{name}={getattr(self, name)!r}: expected one of {allowed}")
        check_region_input(self.region_input, "EvalConfig")
        if self.video_mllm_frames < 1:
            raise ValueError(f"EvalConfig.video_mllm_frames={self.video_mllm_frames}: use >= 1 (upstream: 5)")
        if self.batch_size < 1 or self.max_new_tokens < 1:
            raise ValueError(f"EvalConfig: batch_size={self.batch_size} and max_new_tokens={self.max_new_tokens} "
                             "must both be >= 1")


@dataclass
class TaskResult:
    """Records and metrics of one task; ``meteor15_corpus`` is the jar's corpus METEOR (caption tasks),
    ``skipped`` the ids of bad samples the dataset skipped (``on_bad_sample='skip'``)."""

    task: str
    records: list[EvalRecord]
    metrics: dict[str, Estimate] = field(default_factory=dict)
    meteor15_corpus: float | None = None
    skipped: list[str] = field(default_factory=list)


def first_text(sample, order: Sequence[str]) -> str:
    for attribute in order:
        texts = [t for t in getattr(sample, attribute) if isinstance(t, str) and t.strip()]
        if texts:
            return texts[0]
    raise ValueError(f"sample {sample.sample_id!r} has no {' or '.join(order)}; text tasks need one (drop the "
                     "sample or evaluate only the caption/cycle_iou tasks)")


def answer_mask(answer: Answer) -> np.ndarray | None:
    """bool ``[H, W]`` mask of an answer: the union of its kept ``[SEG]`` masks (``multi_seg``), None without one."""
    if not answer.seg_masks:
        return None
    pred_mask = answer.seg_masks[0]
    for extra in answer.seg_masks[1:]:
        pred_mask = pred_mask | extra
    return pred_mask.numpy()


def references(sample) -> list[str]:
    """Caption references: the sample's captions, else its expressions (as the training rewards)."""
    return [t for t in (list(sample.captions) or list(sample.expressions)) if isinstance(t, str) and t.strip()]


class _Batch:
    """B samples with their frozen features under model A and model B, and A's captions (shared by the
    ``caption`` and ``cycle_iou`` tasks)."""

    def __init__(self, samples, model_a, processor_a, model_b, processor_b, config: EvalConfig) -> None:
        self.samples, self.config = samples, config
        self.model_a, self.processor_a, self.model_b, self.processor_b = model_a, processor_a, model_b, processor_b
        images, names = [s.image for s in samples], [s.sample_id for s in samples]
        self.features_a = encode_images(model_a, processor_a, images, names)
        self.features_b = self.features_a if model_b is model_a and processor_b is processor_a else \
            encode_images(model_b, processor_b, images, names)
        self._captions_a: tuple[list[Answer], list[int]] | None = None

    def _model(self, which: str) -> tuple:
        return ((self.model_a, self.processor_a, self.features_a) if which == "a"
                else (self.model_b, self.processor_b, self.features_b))

    def segment(self, which: str, texts: Sequence[str | None]) -> list[Answer | None]:
        """Model ``which``'s RES answer (with masks) to each text about its sample's image; None for an empty text."""
        model, processor, features = self._model(which)
        return segment_texts(model, processor, features, texts, range(len(texts)),
                             max_new_tokens=self.config.max_new_tokens,
                             seg_masks=MULTI_SEG_RULES[self.config.multi_seg], question=self.config.segment_question)

    def describe(self, which: str, masks: Sequence, empty_region: str) -> list[RegionAnswer | None]:
        """Model ``which``'s caption of each mask of its sample's image; None for a missing or empty mask."""
        model, processor, features = self._model(which)
        return describe_masks(model, processor, features, masks, range(len(masks)),
                              [s.sample_id for s in self.samples], max_new_tokens=self.config.max_new_tokens,
                              empty_region=empty_region, question=self.config.caption_question,
                              region_input=self.config.region_input)

    def captions_a(self) -> tuple[list[Answer], list[int]]:
        """Model A's greedy caption of every gt_mask, and the region tokens each prompt showed."""
        if self._captions_a is None:
            empty = [s.sample_id for s in self.samples if s.gt_mask is None or not s.gt_mask.any()]
            if empty:
                raise ValueError(f"sample {empty[0]!r}: gt_mask has no foreground pixel; drop it from the eval split")
            described = self.describe("a", [s.gt_mask for s in self.samples], self.config.empty_region)
            self._captions_a = ([d.answer for d in described], [d.region_tokens for d in described])
        return self._captions_a


def _res(batch: _Batch) -> list[EvalRecord]:
    cfg = batch.config
    order = ("expressions", "captions") if cfg.text_source == "expression" else ("captions", "expressions")
    texts = [first_text(s, order) for s in batch.samples]
    records = []
    for sample, text, answer in zip(batch.samples, texts, batch.segment("a", texts)):
        stats = MaskStats.from_masks(answer_mask(answer), sample.gt_mask, answer.num_seg, keep_rle=cfg.keep_masks,
                                     sample_id=sample.sample_id)
        records.append(EvalRecord("res", sample.sample_id, stats.iou, text_in=text, answer_a=answer.text,
                                  mask=stats, num_tokens=answer.num_tokens, is_truncated=answer.is_truncated))
    return records


def _caption(batch: _Batch) -> list[EvalRecord]:
    clean = get_cleaner(batch.config.caption_cleaning)
    answers, region_tokens = batch.captions_a()
    records = []
    for sample, answer, k in zip(batch.samples, answers, region_tokens):
        caption, refs = clean(answer.text), references(sample)
        records.append(EvalRecord("caption", sample.sample_id, meteor_per_caption(caption, refs, sample.sample_id),
                                  answer_a=answer.text, caption=caption, references=refs,
                                  num_tokens=answer.num_tokens, is_truncated=answer.is_truncated, region_tokens=k))
    return records


def _cycle_iou(batch: _Batch) -> list[EvalRecord]:
    cfg = batch.config
    captions, region_tokens = batch.captions_a()
    answers_b = batch.segment("b", [a.plain for a in captions])
    records = []
    for sample, caption, answer, k in zip(batch.samples, captions, answers_b, region_tokens):
        stats = MaskStats.from_masks(None if answer is None else answer_mask(answer), sample.gt_mask,
                                     0 if answer is None else answer.num_seg, keep_rle=cfg.keep_masks,
                                     sample_id=sample.sample_id)
        records.append(EvalRecord(
            "cycle_iou", sample.sample_id, stats.iou, answer_a=caption.text,
            answer_b=None if answer is None else answer.text, caption=caption.plain, mask=stats,
            num_tokens=caption.num_tokens + (0 if answer is None else answer.num_tokens),
            is_truncated=caption.is_truncated or (answer is not None and answer.is_truncated), region_tokens=k))
    return records


def _cycle_caption(batch: _Batch) -> list[EvalRecord]:
    cfg = batch.config
    clean = get_cleaner(cfg.caption_cleaning)
    texts = [first_text(s, ("captions", "expressions")) for s in batch.samples]
    answers_a = batch.segment("a", texts)
    described = batch.describe("b", [answer_mask(a) for a in answers_a], "dilate_to_one_cell")
    answers_b = [None if d is None else d.answer for d in described]
    cells = [None if d is None else d.region_tokens for d in described]
    records = []
    for sample, text, a, b, k in zip(batch.samples, texts, answers_a, answers_b, cells):
        caption, refs = ("" if b is None else clean(b.text)), references(sample)
        stats = MaskStats.from_masks(answer_mask(a), sample.gt_mask, a.num_seg, keep_rle=cfg.keep_masks,
                                     sample_id=sample.sample_id)
        records.append(EvalRecord(
            "cycle_caption", sample.sample_id, meteor_per_caption(caption, refs, sample.sample_id), text_in=text,
            answer_a=a.text, answer_b=None if b is None else b.text, caption=caption, references=refs, mask=stats,
            num_tokens=a.num_tokens + (0 if b is None else b.num_tokens),
            is_truncated=a.is_truncated or (b is not None and b.is_truncated), region_tokens=k))
    return records


TASK_FUNCTIONS = {"res": _res, "caption": _caption, "cycle_iou": _cycle_iou, "cycle_caption": _cycle_caption}


def sample_batches(samples: Iterable, batch_size: int, num_samples: int | None, skipped: list[str]):
    """Lists of up to ``batch_size`` RegionSample; SkippedSample entries are dropped and named in ``skipped``."""
    batch = []
    for index, sample in enumerate(samples):
        if num_samples is not None and index >= num_samples:
            break
        if isinstance(sample, SkippedSample):
            skipped.append(sample.sample_id)
            continue
        batch.append(sample)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def iterate_samples(dataset, num_samples: int | None) -> tuple[Iterable, int | None]:
    """Samples (random access when the dataset has ``__len__``) and the total for the progress bar."""
    if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
        total = len(dataset) if num_samples is None else min(num_samples, len(dataset))
        return (dataset[i] for i in range(total)), total
    return dataset, num_samples


def _add_meteor15(result: TaskResult) -> None:
    corpus, segments = meteor15_scores([r.caption or "" for r in result.records],
                                       [r.references for r in result.records])
    for record, score in zip(result.records, segments):
        record.meteor15 = float(score)
    result.meteor15_corpus = float(corpus)


def evaluate(model, processor, dataset: Iterable, tasks: Sequence[str] = TASKS, config: EvalConfig | None = None,
             *, model_b=None, processor_b=None, num_samples: int | None = None) -> dict[str, TaskResult]:
    """Run ``tasks`` over the first ``num_samples`` samples of ``dataset`` (all when None).

    Args:
        model / processor: model A (the system under test) and its processor.
        dataset: a map-style dataset or an iterable of ``RegionSample``.
        model_b / processor_b: the partner of the cycle tasks (default: model A itself).
    Returns:
        task → :class:`TaskResult` with records in dataset order and metrics with bootstrap CIs.
    """
    config = config or EvalConfig()
    unknown = [t for t in tasks if t not in TASK_FUNCTIONS]
    if unknown or not tasks:
        raise ValueError(f"evaluate: tasks={list(tasks)}; choose one or more of {TASKS}")
    if model.seg_token_id is None:
        raise ValueError("evaluate: model has no tokenizer bound; call model.bind_tokenizer(tokenizer) first")
    model_b = model if model_b is None else model_b
    processor_b = processor if processor_b is None else processor_b
    results = {task: TaskResult(task, []) for task in tasks}
    skipped: list[str] = []
    samples, total = iterate_samples(dataset, num_samples)
    with tqdm(total=total, desc=f"evaluate {'+'.join(tasks)}", unit="sample",
              disable=not config.show_progress) as bar:
        for samples_b in sample_batches(samples, config.batch_size, num_samples, skipped):
            batch = _Batch(samples_b, model, processor, model_b, processor_b, config)
            for task in tasks:
                results[task].records.extend(TASK_FUNCTIONS[task](batch))
            bar.update(len(samples_b))
    if not any(r.records for r in results.values()):
        raise ValueError(f"evaluate: no sample to evaluate ({len(skipped)} skipped as bad); check the dataset")
    for result in results.values():
        if config.use_meteor15 and result.task in ("caption", "cycle_caption"):
            _add_meteor15(result)
        result.metrics = summarize(result.task, result.records, n_resamples=config.n_resamples,
                                   confidence=config.confidence, seed=config.seed)
        result.skipped = list(skipped)
    if skipped:
        logger.warning("evaluate: the dataset skipped %d bad samples, e.g. %s", len(skipped), skipped[:3])
    return results


def evaluate_res(model, processor, dataset, config: EvalConfig | None = None, **kwargs) -> TaskResult:
    """Partner-free referring segmentation (cIoU / gIoU)."""
    return evaluate(model, processor, dataset, ("res",), config, **kwargs)["res"]


def evaluate_caption(model, processor, dataset, config: EvalConfig | None = None, **kwargs) -> TaskResult:
    """Partner-free region captioning (METEOR)."""
    return evaluate(model, processor, dataset, ("caption",), config, **kwargs)["caption"]


def evaluate_cycle_iou(model, processor, dataset, config: EvalConfig | None = None, **kwargs) -> TaskResult:
    """Loop-1 cycle: mask → caption (A) → mask' (B) → IoU."""
    return evaluate(model, processor, dataset, ("cycle_iou",), config, **kwargs)["cycle_iou"]


def evaluate_cycle_caption(model, processor, dataset, config: EvalConfig | None = None, **kwargs) -> TaskResult:
    """Loop-2 cycle: caption → mask (A) → caption' (B) → METEOR."""
    return evaluate(model, processor, dataset, ("cycle_caption",), config, **kwargs)["cycle_caption"]


def config_dict(config: EvalConfig) -> dict:
    """The config as plain JSON values (for metrics.json)."""
    return asdict(config)
