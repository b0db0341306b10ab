"""Greedy chat + segmentation with upstream ``predict_forward`` semantics (reference/sa2va.md §4.4).

``predict`` answers one (image, text) pair; ``predict_batch`` runs several at once (left-padded
prompts, one batched greedy decode, one SAM2 pass), on the shared pipeline (``model/pipeline/shared.py``,
``greedy_answers``). Flow per sample:

1. ``<image>`` in ``text`` → image block (+ region string when ``region_mask`` is given), wrapped in
   the template's INSTRUCTION, tokenized as upstream (``add_special_tokens=True``).
2. Greedy decode until EOS or a template stop word, by ``decode_backend`` (default ``'reference'``,
   the plain KV-cache loop :func:`generation.sample_completions`; ``'fast'`` is the rollout decoder).
   Stop words that are one token stop the decode; multi-token ones (``<|end|>`` of ``phi3_chat``
   under a Qwen tokenizer, §8.1) cut the output where the decoded text, ``\\r``/``\\n`` removed,
   first ends with them — upstream's textual criterion.
3. ``prediction = decode(ids, skip_special_tokens=False).strip()`` (the stop token stays in it).
4. One mask per ``[SEG]``, except a ``[SEG]`` that is the last generated token (upstream never feeds
   it back, so it has no hidden state). The hidden state is the final-norm state at the ``[SEG]``
   input position, recomputed by one teacher-forced forward (equal to the decode-time state up to
   kernel round-off) → ``text_hidden_fcs`` → SAM2 (best of multimask) → ``logits_to_masks`` at the
   original size.

Differs from upstream: runs in the model's dtype (upstream casts everything to bf16), and
``predict_batch`` rows may differ from ``predict`` by float round-off of padded batching.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ..decoding.text_decoding import TextDecoding
from .shared import PromptRow, encode_images, greedy_answers


def _region_stack(processor: Any, region_mask: Any, size: tuple[int, int], where: str) -> torch.Tensor:
    """bool ``[N, g, g]`` region cells of a bool ``[H, W]`` mask or ``[N, H, W]`` stack."""
    masks = np.asarray(region_mask)
    masks = masks[None] if masks.ndim == 2 else masks
    if masks.ndim != 3:
        raise ValueError(f"{where}: region_mask must be [H, W] or [N, H, W], got shape {masks.shape}")
    return torch.stack([processor.region_cells(m, sample_id=where, size=size) for m in masks])


@torch.no_grad()
def predict_batch(
    model: Any,
    processor: Any,
    images: Sequence[Any],
    texts: Sequence[str],
    region_masks: Sequence[Any] | None = None,
    max_new_tokens: int = 2048,
    decode_backend: str = "reference",
) -> list[dict[str, Any]]:
    """``predict`` for several samples; returns one ``{"prediction", "prediction_masks"}`` per sample."""
    if len(images) != len(texts) or (region_masks is not None and len(region_masks) != len(images)):
        raise ValueError(f"predict_batch: got {len(images)} images, {len(texts)} texts and "
                         f"{None if region_masks is None else len(region_masks)} region masks; pass one per sample.")
    encoded = encode_images(model, processor, images, [f"image {i}" for i in range(len(images))])
    region_masks = region_masks if region_masks is not None else [None] * len(images)
    rows = []
    for i, (text, region_mask) in enumerate(zip(texts, region_masks)):
        cells = None if region_mask is None else \
            _region_stack(processor, region_mask, encoded.image_sizes[i], f"sample {i}")  # [N, g, g]
        prompt = processor.template_user_turn(processor.expand_image(text, encoded.n_tiles(i), cells))
        rows.append(PromptRow(i, prompt, cells))
    answers = greedy_answers(model, processor, encoded, rows, max_new_tokens=max_new_tokens,
                             decoding=TextDecoding.from_processor(processor, decode_backend), seg_masks="all",
                             use_decoder_states=False)
    return [{"prediction": a.text, "prediction_masks": [m.numpy() for m in a.seg_masks]} for a in answers]


def predict(
    model: Any,
    processor: Any,
    image: Any,
    text: str,
    region_mask: Any = None,
    max_new_tokens: int = 2048,
    decode_backend: str = "reference",
) -> dict[str, Any]:
    """Greedy answer to ``text`` (must contain ``<image>`` once) about a PIL ``image``.

    Args:
        model: a Sa2VAModel with a bound tokenizer.
        processor: the Sa2VAProcessor built from the model's config.
        region_mask: optional bool ``[H, W]`` (or ``[N, H, W]``) region prompt(s) at image size,
            upstream ``mask_prompts``.
        max_new_tokens: 2048 as HF ``predict_forward`` (the training-side helper used 512).
        decode_backend: a key of ``model.decoding.fast_generation.DECODE_BACKENDS``.

    Returns:
        ``{"prediction": str, "prediction_masks": [np.ndarray bool [H, W] per [SEG]]}``.
    """
    regions = None if region_mask is None else [region_mask]
    return predict_batch(model, processor, [image], [text], regions, max_new_tokens, decode_backend)[0]
