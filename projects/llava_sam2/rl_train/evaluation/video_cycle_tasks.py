"""Held-out video tasks over ``VideoRegionSample`` data, greedy and batched: video referring segmentation and the two
training loops on video, scored on held-out clips with the image tasks' records, metrics and bootstrap CIs
(``tasks.py``, ``metrics.py``).

* ``video_res``: gt text (first expression, else first caption) → model A's masklet (``segment_texts_in_clips``:
  ``predict_video``'s chain with the RES eval prompt) → J&F against the gt masklet over every frame, also split into
  the frames the language model saw (memory-free) and the propagated ones. ``evaluation/video_tasks.py``'s
  ``evaluate_video_res`` (the pretraining stage's measure) scores the same chain; the tests pin that the two agree.

* ``video_cycle_jf`` (Loop 1 on video): gt masklet → model A's caption of its key-frame region (the frame where the
  gt masklet is largest, ``data.video.key_frame``, shown as a one-tile image: the loop-1 key frame) → model B's
  masklet for that caption (video RES prompt over the clip's MLLM frames, SAM2 memory propagation over every frame:
  ``segment_texts_in_clips``) → J&F(gt masklet, B's masklet) over every frame.
* ``video_cycle_caption`` (Loop 2 on video): gt text → model A's masklet (``segment_texts_in_clips``) → its key frame
  (the MLLM frame where A's mask is largest: ``largest_mask_frames``, loop 2's choice) → model B's caption of A's mask
  on that frame → METEOR against the references; A's masklet is also scored against the gt masklet (J&F).

Conventions are the image cycle tasks' (``tasks.py``): B reads A's caption as plain text, an empty caption or an
answer without ``[SEG]`` gives an empty masklet (J = 1 only where the gt is empty too), an empty mask gets the caption
"" (METEOR 0). A batch of clips is encoded once per model (``encode_clips``: InternViT on the MLLM frames and the
loop-1 key frames, SAM2 on every frame), and all requested tasks share the pass.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data.rle import encode_mask
from ..data.video import key_frame
from ..model.pipeline.shared import describe_masks
from ..model.pipeline.video import largest_mask_frames, encode_clips, segment_texts_in_clips
from .captions import get_cleaner, meteor_per_caption
from .metrics import VIDEO_TASKS, summarize
from .records import EvalRecord, MaskStats
from .tasks import EvalConfig, TaskResult, first_text, iterate_samples, references, sample_batches
from .video_metrics import score_masklet


class _VideoBatch:
    """B clips encoded once under model A and model B (the loop-1 key frames as still frames)."""

    def __init__(self, samples, model_a, processor_a, model_b, processor_b, config: EvalConfig) -> None:
        self.samples, self.config = samples, config
        self.models = {"a": (model_a, processor_a), "b": (model_b, processor_b)}
        self.gt_masks = []  # B bool [T, H, W]
        for sample in samples:
            if sample.gt_masks is None or not np.asarray(sample.gt_masks).any():
                raise ValueError(f"sample {sample.sample_id!r}: the gt masklet has no foreground pixel; drop it from "
                                 "the eval split")
            self.gt_masks.append(np.asarray(sample.gt_masks, dtype=bool))
        self.key_frames = [key_frame(m) for m in self.gt_masks]
        clips, names = [s.frames for s in samples], [s.sample_id for s in samples]
        stills = list(enumerate(self.key_frames))
        self.encoded = {"a": encode_clips(model_a, processor_a, clips, names, stills,
                                          mllm_frames=config.video_mllm_frames)}
        self.encoded["b"] = self.encoded["a"] if model_b is model_a and processor_b is processor_a else \
            encode_clips(model_b, processor_b, clips, names, stills, mllm_frames=config.video_mllm_frames)
        self._segmented: dict[tuple, tuple] = {}  # (model, texts) -> answers, masklets: video_res and
        # video_cycle_caption ground the same first text when the clips have no caption (MeViS)

    def segment(self, which: str, texts: Sequence[str | None]) -> tuple[list, list[np.ndarray | None]]:
        """Model ``which``'s video RES answer to each text about its clip and the masklet bool ``[T, H, W]`` of its
        first fed-back ``[SEG]`` (None: no text or no ``[SEG]``)."""
        key = (which, tuple(texts))
        if key not in self._segmented:
            model, processor = self.models[which]
            answers, masklets = segment_texts_in_clips(
                model, processor, self.encoded[which], texts, range(len(texts)),
                max_new_tokens=self.config.max_new_tokens, question=self.config.segment_question)
            self._segmented[key] = answers, [None if m is None else m.cpu().numpy() for m in masklets]
        return self._segmented[key]

    def describe(self, which: str, encoded, masks: Sequence, rows: Sequence[int]) -> list:
        """Model ``which``'s caption of each mask on image row ``rows[n]`` of ``encoded`` (None for an empty mask)."""
        model, processor = self.models[which]
        return describe_masks(model, processor, encoded, masks, rows, [self.samples[r].sample_id for r in rows],
                              max_new_tokens=self.config.max_new_tokens, empty_region=self.config.empty_region,
                              question=self.config.caption_question)

    def masklet_fields(self, b: int, pred: np.ndarray | None, num_seg: int) -> dict:
        """The record fields of a predicted masklet of sample ``b`` (None: an empty prediction)."""
        gt = self.gt_masks[b]
        scored = np.zeros_like(gt) if pred is None else pred
        scores = score_masklet(gt, scored)
        stats = MaskStats.from_masks(pred, gt, num_seg, keep_rle=False, sample_id=self.samples[b].sample_id)
        return dict(mask=stats, frame_j=scores.j.tolist(), frame_f=scores.f.tolist(),
                    masklet=[encode_mask(m) for m in scored] if self.config.keep_masks and pred is not None else None,
                    mllm_frames=self.encoded["a"].num_mllm_frames(b))


def _j_and_f(fields: dict) -> float:
    """(mean J + mean F) / 2 of ``masklet_fields``' per-frame scores."""
    return float(np.mean(fields["frame_j"]) + np.mean(fields["frame_f"])) / 2


def _video_res(batch: _VideoBatch) -> list[EvalRecord]:
    texts = [first_text(s, ("expressions", "captions")) for s in batch.samples]
    answers, masklets = batch.segment("a", texts)
    records = []
    for b, (sample, text, answer, masklet) in enumerate(zip(batch.samples, texts, answers, masklets)):
        fields = batch.masklet_fields(b, masklet, answer.num_seg)
        records.append(EvalRecord("video_res", sample.sample_id, _j_and_f(fields), text_in=text, answer_a=answer.text,
                                  num_tokens=answer.num_tokens, is_truncated=answer.is_truncated, **fields))
    return records


def _video_cycle_jf(batch: _VideoBatch) -> list[EvalRecord]:
    stills = batch.encoded["a"].stills
    gt_key = [m[k] for m, k in zip(batch.gt_masks, batch.key_frames)]
    captions = batch.describe("a", stills, gt_key, range(len(gt_key)))
    answers_b, masklets_b = batch.segment("b", [d.answer.plain for d in captions])
    records = []
    for b, (sample, described, answer, pred) in enumerate(zip(batch.samples, captions, answers_b, masklets_b)):
        caption = described.answer
        fields = batch.masklet_fields(b, pred, 0 if answer is None else answer.num_seg)
        records.append(EvalRecord(
            "video_cycle_jf", sample.sample_id, _j_and_f(fields),
            answer_a=caption.text, answer_b=None if answer is None else answer.text, caption=caption.plain,
            num_tokens=caption.num_tokens + (0 if answer is None else answer.num_tokens),
            is_truncated=caption.is_truncated or (answer is not None and answer.is_truncated),
            region_tokens=int(described.region_cells.sum()), key_frame=batch.key_frames[b], **fields))
    return records


def _video_cycle_caption(batch: _VideoBatch) -> list[EvalRecord]:
    clean = get_cleaner(batch.config.caption_cleaning)
    texts = [first_text(s, ("captions", "expressions")) for s in batch.samples]
    answers_a, masklets_a = batch.segment("a", texts)
    with_seg = [b for b, answer in enumerate(answers_a) if answer.seg_prompts]
    key_frames: list[int | None] = [None] * len(texts)
    described: list = [None] * len(texts)
    if with_seg:
        model, _ = batch.models["a"]
        prompts = torch.stack([answers_a[b].seg_prompts[0] for b in with_seg])
        for b, k in zip(with_seg, largest_mask_frames(model, batch.encoded["a"], with_seg, prompts)):
            key_frames[b] = k
        frames = batch.encoded["b"].frame_images(with_seg, [key_frames[b] for b in with_seg])
        for b, d in zip(with_seg, batch.describe("b", frames, [masklets_a[b][key_frames[b]] for b in with_seg],
                                                 range(len(with_seg)))):
            described[b] = d
    records = []
    for b, (sample, text, a, d) in enumerate(zip(batch.samples, texts, answers_a, described)):
        caption_b = None if d is None else d.answer
        caption, refs = ("" if caption_b is None else clean(caption_b.text)), references(sample)
        records.append(EvalRecord(
            "video_cycle_caption", sample.sample_id, meteor_per_caption(caption, refs, sample.sample_id),
            text_in=text, answer_a=a.text, answer_b=None if caption_b is None else caption_b.text, caption=caption,
            references=refs, num_tokens=a.num_tokens + (0 if caption_b is None else caption_b.num_tokens),
            is_truncated=a.is_truncated or (caption_b is not None and caption_b.is_truncated),
            region_tokens=None if d is None else int(d.region_cells.sum()), key_frame=key_frames[b],
            **batch.masklet_fields(b, masklets_a[b], a.num_seg)))
    return records


VIDEO_TASK_FUNCTIONS = {"video_res": _video_res, "video_cycle_jf": _video_cycle_jf,
                        "video_cycle_caption": _video_cycle_caption}


@torch.no_grad()
def evaluate_video(model, processor, dataset: Iterable, tasks: Sequence[str] = VIDEO_TASKS,
                   config: EvalConfig | None = None, *, model_b=None, processor_b=None,
                   num_samples: int | None = None) -> dict[str, TaskResult]:
    """Run the video ``tasks`` over the first ``num_samples`` clips of ``dataset`` (all when None); as
    ``tasks.evaluate`` (records in dataset order, metrics with bootstrap CIs, model B default model A)."""
    config = config or EvalConfig()
    unknown = [t for t in tasks if t not in VIDEO_TASK_FUNCTIONS]
    if unknown or not tasks:
        raise ValueError(f"evaluate_video: tasks={list(tasks)}; choose one or more of {VIDEO_TASKS}")
    if model.seg_token_id is None:
        raise ValueError("evaluate_video: model has no tokenizer bound; call model.bind_tokenizer(tokenizer) first")
    if config.region_input == "drawn":
        raise ValueError("evaluate_video: the video tasks show a key frame's region as region tokens only; "
                         "EvalConfig.region_input='drawn' is an image-task option")
    model_b = model if model_b is None else model_b
    processor_b = processor if processor_b is None else processor_b
    results = {task: TaskResult(task, []) for task in tasks}
    skipped: list[str] = []
    samples, total = iterate_samples(dataset, num_samples)
    with tqdm(total=total, desc=f"evaluate {'+'.join(tasks)}", unit="clip", disable=not config.show_progress) as bar:
        for samples_b in sample_batches(samples, config.batch_size, num_samples, skipped):
            batch = _VideoBatch(samples_b, model, processor, model_b, processor_b, config)
            for task in tasks:
                results[task].records.extend(VIDEO_TASK_FUNCTIONS[task](batch))
            bar.update(len(samples_b))
    if not any(r.records for r in results.values()):
        raise ValueError(f"evaluate_video: no clip to evaluate ({len(skipped)} skipped as bad); check the dataset")
    for result in results.values():
        result.metrics = summarize(result.task, result.records, n_resamples=config.n_resamples,
                                   confidence=config.confidence, seed=config.seed)
        result.skipped = list(skipped)
    return results
