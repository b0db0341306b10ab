"""The EMA partner's two tasks in the cycle loops (segment a caption: loop 1; describe a mask: loop 2), and the
row-slicing helpers of the replays.

Both tasks are the shared model pipeline's (``model.pipeline.shared.segment_texts`` / ``describe_masks``), the code the
held-out evaluation's cycle tasks run; these functions add the loops' conventions (an empty caption or a missing
``[SEG]`` gives an all-False mask, an all-False mask gets the caption ``""``) and their statistics.

Every function takes the weights in effect as they are: the caller enters ``WeightSets.partner`` around it and
passes ``tile_embeds = model.project_vision(features.vit_tokens)`` computed inside that block (``mlp1`` is one of
the swapped tensors). Rows are batched; ``chunk_size`` caps the rows of one model call
(``GRPOConfig.generation_chunk_size``). Text is decoded by ``TextDecoding.decode_backend``
(``GRPOConfig.decode_backend``): the fast path (``model.decoding.fast_generation``) by default.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, replace

import torch
from torch import Tensor

from ..model.decoding.text_decoding import TextDecoding, group_chunks
from ..model.pipeline.shared import Answer, EncodedImages, describe_masks, segment_texts
from ..model.pipeline.video import segment_texts_in_clips
from .features import StepFeatures, VideoStep


def slice_rows(data, r0: int, r1: int):
    """Rows ``[r0, r1)`` of every tensor field of a replay dataclass (``CaptionReplay`` / ``MaskReplay`` /
    ``AnswerReplay``); optional fields that are None stay None."""
    return replace(data, **{f.name: getattr(data, f.name)[r0:r1] for f in fields(data)
                            if getattr(data, f.name) is not None})


def cat_chunks(fn: Callable[[int, int], Tensor], num_groups: int, group_size: int, chunk_size: int | None) -> Tensor:
    """``cat([fn(b0, b1) for each chunk], 0)``; ``fn`` returns rows ``[(b1 - b0) * G, ...]``."""
    return torch.cat([fn(b0, b1) for b0, b1 in group_chunks(num_groups, group_size, chunk_size)], dim=0)


@torch.no_grad()
def partner_segment(model, processor, features: StepFeatures, tile_embeds: Tensor, captions: Sequence[str],
                    images: Sequence[int], decoding: TextDecoding, *, max_new_tokens: int,
                    chunk_size: int | None) -> tuple[list[Tensor], dict[str, float]]:
    """Loop 1's second half: ground each caption with the weights in effect (the EMA partner).

    Per caption: RES prompt (``processor.segment_prompt``) → greedy answer of at most ``max_new_tokens`` → the mask
    of its first fed-back ``[SEG]`` (``greedy_answers(seg_masks='first')``). An empty caption or an answer without
    a fed-back ``[SEG]`` gives an all-False mask (IoU 0 against a non-empty gt_mask), counted in the stats.

    Returns N bool ``[H, W]`` CPU masks and counts ``partner/empty_caption``, ``partner/no_seg``,
    ``partner/answer_tokens`` (mean answer length).
    """
    answers = segment_texts(model, processor, features, captions, images, max_new_tokens=max_new_tokens,
                            seg_masks="first", decoding=decoding, tile_embeds=tile_embeds, chunk_size=chunk_size)
    pred_masks = [torch.zeros(features.image_sizes[i], dtype=torch.bool) for i in images]
    for n, answer in enumerate(answers):
        if answer is not None and answer.seg_masks:
            pred_masks[n] = answer.seg_masks[0]
    return pred_masks, _segment_stats(answers)


def _segment_stats(answers: Sequence[Answer | None]) -> dict[str, float]:
    valid = [answer for answer in answers if answer is not None]
    return {"partner/empty_caption": float(len(answers) - len(valid)),
            "partner/no_seg": float(sum(answer.num_seg == 0 for answer in valid)),
            "partner/answer_tokens": sum(answer.num_tokens for answer in valid) / max(1, len(valid))}


@torch.no_grad()
def partner_segment_video(model, processor, video: VideoStep, tile_embeds: Tensor, captions: Sequence[str],
                          samples: Sequence[int], decoding: TextDecoding, *, max_new_tokens: int,
                          chunk_size: int | None) -> tuple[list[Tensor], dict[str, float]]:
    """Loop 1's second half on video: ground each caption in its sample's whole clip with the weights in effect.

    Per caption: video RES prompt over the clip's MLLM frames → greedy answer → its first fed-back ``[SEG]``'s SAM2
    prompt → memory propagation over every frame (``segment_texts_in_clips``). An empty caption or an answer
    without a fed-back ``[SEG]`` gives an all-False masklet; statistics as :func:`partner_segment`.

    Args:
        tile_embeds: ``model.project_vision(encoded.clips.vit_tokens)`` under the weights in effect.
        samples: per caption, its sample's row in ``video`` (clip ``video.clip_index[sample]``).

    Returns N bool ``[T, H, W]`` masklets on the model's device (the video reward counts them there) and the
    statistics.
    """
    clips = video.encoded
    clip_rows = [video.clip_index[b] for b in samples]
    answers, masklets = segment_texts_in_clips(model, processor, clips, captions, clip_rows,
                                               max_new_tokens=max_new_tokens, decoding=decoding,
                                               tile_embeds=tile_embeds, chunk_size=chunk_size)
    pred_masks = [m if m is not None else torch.zeros((clips.num_frames(c), *clips.clips.image_sizes[c]),
                                                      dtype=torch.bool, device=tile_embeds.device)
                  for m, c in zip(masklets, clip_rows)]
    return pred_masks, _segment_stats(answers)


@torch.no_grad()
def partner_describe(model, processor, features: EncodedImages, tile_embeds: Tensor, pred_masks: Sequence[Tensor],
                     images: Sequence[int], sample_ids: Sequence[str], decoding: TextDecoding, *,
                     max_new_tokens: int, chunk_size: int | None) -> tuple[list[str], dict[str, float]]:
    """Loop 2's second half: describe each sampled mask with the weights in effect (the EMA partner).

    Per mask: region cells (upstream nearest sampling; a non-empty mask that hits no sample point gets the one
    cell it covers most, ``empty_region='dilate_to_one_cell'``, so every non-empty action is shown to the partner)
    → region-caption prompt → greedy caption of at most ``max_new_tokens`` (``Answer.plain``). An all-False mask
    gets the caption ``""`` (no region to describe: the caption rewards score it as a bad description), counted in
    the stats.

    Returns N captions and counts ``partner/empty_mask``, ``partner/caption_tokens`` (mean length).
    """
    described = describe_masks(model, processor, features, pred_masks, images, sample_ids,
                               max_new_tokens=max_new_tokens, empty_region="dilate_to_one_cell", decoding=decoding,
                               tile_embeds=tile_embeds, chunk_size=chunk_size)
    captions = ["" if d is None else d.answer.plain for d in described]
    valid = [d.answer for d in described if d is not None]
    stats = {"partner/empty_mask": float(len(pred_masks) - len(valid)),
             "partner/caption_tokens": sum(answer.num_tokens for answer in valid) / max(1, len(valid))}
    return captions, stats
