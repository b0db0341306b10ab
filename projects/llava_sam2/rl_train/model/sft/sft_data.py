"""SFT examples from RegionSamples: region captioning and referring segmentation.

Each example mirrors an upstream Sa2VA training item, single turn:

* caption (Osprey description data): user text = image block + ``\\n`` + region string + a caption
  question; answer = one of the sample's captions with '<' and '>' removed (Osprey cleaning).
  Item carries ``prompt_masks`` bool [1, g, g] and ``vp_overall_mask`` (True on the last tile).
* segment (RefCOCO data): user text = image block + ``\\n`` + a SEG_QUESTIONS entry filled with the
  normalised expression ('<', '>' removed too, so no text can become a special token); answer = one of ANSWER_LIST (contains ``[SEG]``). Item carries
  ``g_pixel_values`` [3, S_sam, S_sam] and ``masks`` uint8 [1, H, W].

Differs from upstream Sa2VA: RefCOCO items there use a phi3-style INSTRUCTION whatever the configured
template (reference/sa2va.md §8 pitfall 2); here every item uses the configured template, so SFT
prompts equal inference/RL prompts.

Randomness (question, answer, which caption/expression) comes from a generator seeded by
(seed, index), so an item is the same whatever the worker or epoch order.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..text.processor import Sa2VAProcessor
from ..text.prompts import (
    ANSWER_LIST,
    DETAILED_QUESTIONS,
    REGION_CAPTION_EVAL_PROMPT,
    SEG_QUESTIONS,
    detailed_question,
    normalize_expression,
    strip_angle_brackets,
)

if TYPE_CHECKING:  # model/ reads RegionSample by its fields only; no runtime import of data/
    from ...data.types import RegionSample

SFT_TASKS = ("caption", "segment")
# The RefCOCOg eval question (the RL / eval form) plus the 30 Osprey detailed-description questions.
DEFAULT_CAPTION_QUESTIONS = (REGION_CAPTION_EVAL_PROMPT,) + tuple(
    detailed_question(q) for q in DETAILED_QUESTIONS
)
SEGMENT_TEXT_SOURCES = ("expressions", "captions")


def caption_example(processor: Sa2VAProcessor, sample: RegionSample, rng: np.random.Generator, *,
                    questions: Sequence[str] = DEFAULT_CAPTION_QUESTIONS, max_length: int = 8192) -> dict:
    """One region-captioning SFT item (see module docstring)."""
    if not sample.captions:
        raise ValueError(f"sample {sample.sample_id!r}: no captions for the 'caption' task; use "
                         "tasks=('segment',) for referring-only data")
    image = processor.preprocess_image(sample.image, where=f"sample {sample.sample_id!r}")
    cells = processor.region_cells(sample.gt_mask, sample_id=sample.sample_id, size=image.size)  # [g, g]
    question = questions[int(rng.integers(len(questions)))]
    answer = strip_angle_brackets(sample.captions[int(rng.integers(len(sample.captions)))]).strip()
    if not answer:
        raise ValueError(f"sample {sample.sample_id!r}: empty caption after cleaning; fix the annotation")
    text = processor.caption_text(image.n_tiles, cells, question)
    encoded = processor.encode_fn(_single_turn(text, answer, sample.sample_id), max_length)
    vp_overall_mask = torch.zeros(image.n_tiles, dtype=torch.bool)
    vp_overall_mask[-1] = True  # region tokens come from the last tile (the thumbnail when tiled)
    return {**encoded, "pixel_values": image.pixel_values, "prompt_masks": cells[None],
            "vp_overall_mask": vp_overall_mask, "sample_id": sample.sample_id, "task": "caption"}


def segment_example(processor: Sa2VAProcessor, sample: RegionSample, rng: np.random.Generator, *,
                    questions: Sequence[str] = SEG_QUESTIONS, answers: Sequence[str] = ANSWER_LIST,
                    text_sources: Sequence[str] = SEGMENT_TEXT_SOURCES, max_length: int = 8192) -> dict:
    """One referring-segmentation SFT item; the text is drawn from the first non-empty source."""
    texts = next((getattr(sample, src) for src in text_sources if getattr(sample, src)), None)
    if texts is None:
        raise ValueError(f"sample {sample.sample_id!r}: no text in {list(text_sources)} for the "
                         "'segment' task; use tasks=('caption',) or add expressions")
    image = processor.preprocess_image(sample.image, where=f"sample {sample.sample_id!r}")
    gt_mask = np.asarray(sample.gt_mask)
    if gt_mask.shape != image.size:
        raise ValueError(f"sample {sample.sample_id!r}: gt_mask shape {gt_mask.shape} != image (H, W) "
                         f"{image.size}")
    expression = normalize_expression(strip_angle_brackets(texts[int(rng.integers(len(texts)))]),
                                      where=f"sample {sample.sample_id!r}")
    question = questions[int(rng.integers(len(questions)))]
    answer = answers[int(rng.integers(len(answers)))]
    text = processor.segment_text(image.n_tiles, expression, question)
    encoded = processor.encode_fn(_single_turn(text, answer, sample.sample_id), max_length)
    masks = torch.from_numpy(gt_mask.astype(np.uint8))[None]  # [1, H, W]
    return {**encoded, "pixel_values": image.pixel_values, "g_pixel_values": image.g_pixel_values,
            "masks": masks, "sample_id": sample.sample_id, "task": "segment"}


def _single_turn(text: str, answer: str, sample_id: str) -> dict:
    return {"conversation": [{"input": text, "output": answer}], "sample_id": sample_id}


class RegionSFTDataset(Dataset):
    """SFT items over a dataset of RegionSample; item ``i`` is task ``tasks[i % len(tasks)]`` of sample
    ``i // len(tasks)``. Items feed ``Sa2VAProcessor.sft_collate``."""

    def __init__(self, region_dataset: Any, processor: Sa2VAProcessor,
                 tasks: Sequence[str] = SFT_TASKS, seed: int = 0, *, max_length: int = 8192,
                 caption_questions: Sequence[str] = DEFAULT_CAPTION_QUESTIONS,
                 seg_questions: Sequence[str] = SEG_QUESTIONS, answers: Sequence[str] = ANSWER_LIST,
                 segment_text_sources: Sequence[str] = SEGMENT_TEXT_SOURCES) -> None:
        tasks = tuple(tasks)
        if not tasks or any(task not in SFT_TASKS for task in tasks):
            raise ValueError(f"tasks={tasks!r}: expected a non-empty subset of {SFT_TASKS}")
        for name, pool in (("caption_questions", caption_questions), ("seg_questions", seg_questions),
                           ("answers", answers)):
            if len(pool) == 0:
                raise ValueError(f"{name} is empty; pass at least one string")
        bad_sources = [s for s in segment_text_sources if s not in SEGMENT_TEXT_SOURCES]
        if not segment_text_sources or bad_sources:
            raise ValueError(f"segment_text_sources={segment_text_sources!r}: expected names from "
                             f"{SEGMENT_TEXT_SOURCES}")
        self.region_dataset = region_dataset
        self.processor = processor
        self.tasks = tasks
        self.seed = int(seed)
        self.max_length = max_length
        self.caption_questions = tuple(caption_questions)
        self.seg_questions = tuple(seg_questions)
        self.answers = tuple(answers)
        self.segment_text_sources = tuple(segment_text_sources)

    def __len__(self) -> int:
        return len(self.region_dataset) * len(self.tasks)

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < len(self):
            raise IndexError(f"RegionSFTDataset index {index} out of range [0, {len(self)})")
        sample = self.region_dataset[index // len(self.tasks)]
        task = self.tasks[index % len(self.tasks)]
        rng = np.random.default_rng([self.seed, index])
        if task == "caption":
            return caption_example(self.processor, sample, rng, questions=self.caption_questions,
                                   max_length=self.max_length)
        return segment_example(self.processor, sample, rng, questions=self.seg_questions,
                               answers=self.answers, text_sources=self.segment_text_sources,
                               max_length=self.max_length)
