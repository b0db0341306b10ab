"""Greedy chat + segmentation with upstream ``predict_forward`` semantics (reference/sa2va.md §4.4).

``predict`` answers one (image, text) pair; ``predict_batch`` runs several at once (left-padded
prompts, one batched greedy decode, one SAM2 pass). Flow per sample:

1. ``<image>`` in ``text`` → image block (+ region string when ``region_mask`` is given), wrapped in
   the template's INSTRUCTION, tokenized as upstream (``add_special_tokens=True``).
2. Greedy decode (:func:`generation.sample_completions`) until EOS or a template stop word.
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

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from .generation import completion_logprobs, sample_completions


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Put every submodule in eval mode, then restore each module's own flag (even on error)."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, was_training in flags:
            module.training = was_training


def stop_criteria(tokenizer: Any, stop_words: Sequence[str]) -> tuple[list[int], list[str]]:
    """``(stop_token_ids, textual_stop_words)``: EOS plus every stop word that is one token, and the
    stop words the tokenizer splits into several tokens (matched on decoded text)."""
    ids = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    textual = []
    for word in stop_words:
        encoded = tokenizer.encode(word, add_special_tokens=False)
        if len(encoded) == 1:
            ids.append(int(encoded[0]))
        else:
            textual.append(word)
    if not ids:
        raise ValueError("predict: the tokenizer has no eos_token_id and the template no single-token stop "
                         "word; set tokenizer.eos_token.")
    return sorted(set(ids)), textual


def textual_stop_length(tokenizer: Any, ids: list[int], stop_words: Sequence[str]) -> int:
    """Smallest n such that ``decode(ids[:n])`` with ``\\r``/``\\n`` removed ends with a stop word, else len(ids)."""
    for n in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:n], skip_special_tokens=False).replace("\r", "").replace("\n", "")
        if any(text.endswith(word) for word in stop_words):
            return n
    return len(ids)


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
) -> list[dict[str, Any]]:
    """``predict`` for several samples; returns one ``{"prediction", "prediction_masks"}`` per sample."""
    if len(images) != len(texts) or (region_masks is not None and len(region_masks) != len(images)):
        raise ValueError(f"predict_batch: got {len(images)} images, {len(texts)} texts and "
                         f"{None if region_masks is None else len(region_masks)} region masks; pass one per sample.")
    tok = processor.tokenizer
    inputs = [processor.preprocess_image(im, where=f"image {i}") for i, im in enumerate(images)]
    region_masks = region_masks if region_masks is not None else [None] * len(images)
    cells = [None if m is None else _region_stack(processor, m, x.size, f"sample {i}")
             for i, (m, x) in enumerate(zip(region_masks, inputs))]
    prompts = [processor.template_user_turn(processor.expand_image(t, x.n_tiles, c))
               for t, x, c in zip(texts, inputs, cells)]
    input_ids, attention = processor.tokenize_prompts(prompts)  # [N, L] left padded
    device = model.device
    input_ids, attention = input_ids.to(device), attention.to(device)
    with eval_mode(model):
        tiles = model.project_vision(model.encode_vision(torch.cat([x.pixel_values for x in inputs]).to(device)))
        starts = np.cumsum([0] + [x.n_tiles for x in inputs])
        fills = [model.build_image_embeds(tiles[a:b], c) for a, b, c in zip(starts[:-1], starts[1:], cells)]
        embeds = model.embed_inputs(input_ids, fills)  # [N, L, D]
        stop_ids, stop_words = stop_criteria(tok, processor.template.get("STOP_WORDS", []))
        out = sample_completions(model.language_model, embeds, attention, max_new_tokens=max_new_tokens,
                                 do_sample=False, stop_token_ids=stop_ids, pad_token_id=processor.pad_token_id)
        _, hidden = completion_logprobs(model.language_model, embeds, attention, out.ids, out.completion_mask,
                                        return_hidden=True)  # [N, T, D]
        results, seg_hidden, image_index = [], [], []
        for i in range(len(images)):
            ids = out.ids[i, :int(out.completion_mask[i].sum())].tolist()
            if stop_words:
                ids = ids[:textual_stop_length(tok, ids, stop_words)]
            seg_positions = [t for t, token in enumerate(ids[:-1]) if token == model.seg_token_id]
            seg_hidden += [hidden[i, t] for t in seg_positions]
            image_index += [i] * len(seg_positions)
            results.append({"prediction": tok.decode(ids, skip_special_tokens=False).strip(),
                            "prediction_masks": []})
        if seg_hidden:
            features = model.encode_grounding(torch.stack([x.g_pixel_values for x in inputs]).to(device))
            prompt = model.seg_hidden_to_prompt(torch.stack(seg_hidden))  # [M, C_sam]
            best = model.decode_masks(prompt, features, torch.tensor(image_index, device=device)).best_logits
            masks = model.logits_to_masks(best, [inputs[i].size for i in image_index])  # M × bool [H, W]
            for i, m in zip(image_index, masks):
                results[i]["prediction_masks"].append(m.cpu().numpy())
    return results


def predict(
    model: Any,
    processor: Any,
    image: Any,
    text: str,
    region_mask: Any = None,
    max_new_tokens: int = 2048,
) -> dict[str, Any]:
    """Greedy answer to ``text`` (must contain ``<image>`` once) about a PIL ``image``.

    Args:
        model: a Sa2VAModel with a bound tokenizer.
        processor: the Sa2VAProcessor built from the model's config.
        region_mask: optional bool ``[H, W]`` (or ``[N, H, W]``) region prompt(s) at image size,
            upstream ``mask_prompts``.
        max_new_tokens: 2048 as HF ``predict_forward`` (the training-side helper used 512).

    Returns:
        ``{"prediction": str, "prediction_masks": [np.ndarray bool [H, W] per [SEG]]}``.
    """
    regions = None if region_mask is None else [region_mask]
    return predict_batch(model, processor, [image], [text], regions, max_new_tokens)[0]
