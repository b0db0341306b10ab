"""Held-out video evaluation task ``video_res``: referring video object segmentation, scored by J&F.

Per clip (a ``VideoRegionSample``: frames, the target's masklet, its expressions): the clip is encoded once
(``model.pipeline.video.encode_video``: InternViT on the first n = min(5, T) frames, SAM2 on all T), each of its
first ``expressions_per_clip`` expressions is asked with the RES eval prompt in the video layout (``video_prompt``),
all in one batched greedy call, and the first fed-back ``[SEG]`` of each answer is propagated over the clip (one
``video_masklet_logits`` call for all of them) into a masklet: ``predict_video``'s chain, batched. An answer without ``[SEG]`` predicts an empty
masklet. Each masklet gets DAVIS's per-frame J (region IoU) and F (boundary F-measure, ``video_metrics``), every
frame scored (the referring protocol), and is summarised three ways: J&F over all T frames, over the memory-free
frames t < n (prompted, as the image path) and over the propagated frames t >= n (decoded from SAM2's memory).
Each summary is a mean over masklets with a percentile-bootstrap 95 % CI (masklets resampled).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..model.decoding.text_decoding import TextDecoding
from ..model.pipeline.shared import greedy_answers
from ..model.pipeline.video import MLLM_FRAMES, encode_video, masklet_masks, video_masklet_logits, video_prompt
from ..model.text.prompts import RES_EVAL_PROMPT
from .bootstrap import Estimate, bootstrap_mean
from .video_metrics import score_masklets

VIDEO_TASKS = ("video_res",)
FRAME_GROUPS = ("all", "memory_free", "propagated")


@dataclass
class VideoRecord:
    """One (clip, expression): the answer, whether it had a ``[SEG]``, and per-frame J and F ``[T]``."""

    sample_id: str
    text: str
    answer: str
    has_mask: bool
    num_mllm_frames: int
    j: list[float]
    f: list[float]

    def j_and_f(self, group: str) -> float | None:
        """(mean J + mean F) / 2 over the frames of ``group`` (``FRAME_GROUPS``); None when it has no frame."""
        n = self.num_mllm_frames
        frames = {"all": slice(None), "memory_free": slice(0, n), "propagated": slice(n, None)}[group]
        j, f = self.j[frames], self.f[frames]
        return (float(np.mean(j)) + float(np.mean(f))) / 2 if j else None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class VideoTaskResult:
    """Records and metrics (``j_and_f``, ``j_and_f_memory_free``, ``j_and_f_propagated``, ``j``, ``f``,
    ``no_seg_rate``) of one video task."""

    task: str
    records: list[VideoRecord]
    metrics: dict[str, Estimate] = field(default_factory=dict)


@torch.no_grad()
def evaluate_video_res(model, processor, dataset: Iterable, *, num_samples: int | None = None,
                       expressions_per_clip: int = 1, mllm_frames: int = MLLM_FRAMES, max_new_tokens: int = 64,
                       question: str = RES_EVAL_PROMPT, n_resamples: int = 1000, seed: int = 0) -> VideoTaskResult:
    """Task ``video_res`` on the first ``num_samples`` clips of ``dataset`` (all when None); module doc."""
    if expressions_per_clip < 1:
        raise ValueError(f"evaluate_video_res: expressions_per_clip={expressions_per_clip}; use >= 1")
    decoding = TextDecoding.from_processor(processor)  # the fast greedy path, as the image tasks
    records = []
    for index, sample in enumerate(dataset):
        if num_samples is not None and index >= num_samples:
            break
        texts = [t for t in sample.expressions if isinstance(t, str) and t.strip()][:expressions_per_clip]
        if not texts:
            raise ValueError(f"sample {sample.sample_id!r} has no expression; video_res needs one")
        video = encode_video(model, processor, sample.frames, where=sample.sample_id, mllm_frames=mllm_frames)
        rows = [video_prompt(processor, video, question.format(sent=text)) for text in texts]
        answers = greedy_answers(model, processor, video.encoded, rows, max_new_tokens=max_new_tokens,
                                 decoding=decoding, seg_masks="first", use_decoder_states=False, image_masks=False)
        with_seg = [i for i, a in enumerate(answers) if a.seg_prompts]
        masklets = {}  # on the model's device, where J&F counts them
        if with_seg:
            logits = video_masklet_logits(model, video, torch.stack([answers[i].seg_prompts[0] for i in with_seg]))
            masklets = {i: masklet_masks(model, logits[k], video.size) for k, i in enumerate(with_seg)}
        gt = torch.as_tensor(np.asarray(sample.gt_masks, dtype=bool))  # [T, H, W]
        empty = torch.zeros_like(gt)
        scored = score_masklets([gt] * len(texts), [masklets.get(i, empty) for i in range(len(texts))])
        for i, (text, answer, scores) in enumerate(zip(texts, answers, scored)):
            records.append(VideoRecord(sample.sample_id, text, answer.text, i in masklets, video.num_mllm_frames,
                                       scores.j.tolist(), scores.f.tolist()))
    return VideoTaskResult("video_res", records, summarize_video(records, n_resamples=n_resamples, seed=seed))


def summarize_video(records: list[VideoRecord], *, n_resamples: int = 1000, seed: int = 0) -> dict[str, Estimate]:
    """Bootstrap means over records: J&F of each frame group (a group with no frame in any record is left out),
    mean J and F over all frames, and the share of answers without ``[SEG]``."""
    if not records:
        raise ValueError("summarize_video: no records")
    knobs = dict(n_resamples=n_resamples, seed=seed)
    metrics = {}
    for group in FRAME_GROUPS:
        values = [v for v in (r.j_and_f(group) for r in records) if v is not None]
        if values:
            metrics["j_and_f" if group == "all" else f"j_and_f_{group}"] = bootstrap_mean(values, **knobs)
    metrics["j"] = bootstrap_mean([float(np.mean(r.j)) for r in records], **knobs)
    metrics["f"] = bootstrap_mean([float(np.mean(r.f)) for r in records], **knobs)
    metrics["no_seg_rate"] = bootstrap_mean([0.0 if r.has_mask else 1.0 for r in records], **knobs)
    return metrics
