"""Greedy, batched Sa2VA answers over images whose frozen encoders ran once.

:func:`encode_images` runs InternViT (+ pixel shuffle) and the SAM2 image encoder once per distinct
image of a batch; :func:`greedy_answers` then answers any number of prompt rows about those images
(several tasks, model A then model B) without re-encoding. Per row the semantics are those of
``model.inference.predict_batch`` (HF ``predict_forward``, reference/sa2va.md §4.4):

1. the expanded user text (image block, + region string for region prompts) in the template's
   INSTRUCTION, left padded;
2. greedy decode until EOS / a single-token stop word, then the textual stop-word cut;
3. ``text = decode(ids, skip_special_tokens=False).strip()``;
4. one mask per fed-back ``[SEG]`` (a ``[SEG]`` that is the last generated token has no mask), from
   the final-norm hidden state at its input position → ``text_hidden_fcs`` → SAM2 best-of-multimask
   → ``logits_to_masks`` at the image size. The state is the one the decoder computed when it fed the
   token back (upstream ``predict_forward`` reads it from ``generate``); ``predict_batch`` re-runs
   prompt + answer teacher-forced instead, equal up to float reordering.

``multi_seg`` chooses the mask of an answer with several ``[SEG]``: ``'first'`` (Sa2VA's original
RefCOCO eval keeps ``prediction_masks[0]``) or ``'union'`` (the newer bytedance/Sa2VA eval ORs them).
``mlp1`` is applied per call (it is trainable and may differ between model A and model B). The decode runs
on ``decode_backend`` (``model.fast_generation.DECODE_BACKENDS``): the fast path by default, ``'reference'`` for
the plain loop ``predict_batch`` uses.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..model.constants import IMAGE_PLACEHOLDER, INTERNVL_SPECIAL_TOKENS, SA2VA_SPECIAL_TOKENS
from ..model.fast_generation import decode_completions
from ..model.generation import completion_hidden
from ..model.inference import eval_mode, stop_criteria, textual_stop_length

MULTI_SEG_RULES = ("first", "union")


@dataclass
class ImageFeatures:
    """Frozen-encoder outputs of I images (no grad).

    Attributes:
        sizes: I pairs (H, W) of the original images.
        n_tiles: I tile counts (thumbnail last within an image).
        vit_tokens: ``[Σ n_tiles, t, 4C]`` ViT tokens after pixel shuffle, image by image.
        tile_start: I + 1 offsets into ``vit_tokens``.
        grounding: SAM2 ``GroundingFeatures`` of the I images.
    """

    sizes: list[tuple[int, int]]
    n_tiles: list[int]
    vit_tokens: Tensor
    tile_start: list[int]
    grounding: object


@dataclass
class PromptRow:
    """One question about one encoded image.

    Attributes:
        image: row of the image in :class:`ImageFeatures`.
        text: user text with the image block (and region string) already expanded, i.e. the output of
            ``processor.segment_text`` / ``processor.caption_text``.
        region_cells: the bool ``[g, g]`` cells given to ``caption_text`` (their tokens fill the region
            slots), or None.
    """

    image: int
    text: str
    region_cells: Tensor | None = None


@dataclass
class Answer:
    """A greedy answer.

    Attributes:
        text: ``decode(ids, skip_special_tokens=False).strip()`` (stop token included, as ``predict``).
        plain: the answer as prompt text: stop words, special tokens and Sa2VA/InternVL tags removed,
            whitespace collapsed (what a partner model is given in the cycle loops).
        num_tokens: generated tokens (after the textual stop cut).
        is_truncated: no stop token within ``max_new_tokens``.
        num_seg: fed-back ``[SEG]`` tokens (each would give one mask).
        pred_mask: bool ``[H, W]`` (see ``multi_seg``), None when ``num_seg == 0`` or masks were not asked.
    """

    text: str
    plain: str
    num_tokens: int
    is_truncated: bool
    num_seg: int
    pred_mask: np.ndarray | None


@torch.no_grad()
def encode_images(model, processor, images: Sequence, where: Sequence[str]) -> ImageFeatures:
    """Preprocess I PIL images and run both frozen encoders once (one batched call each)."""
    if len(images) == 0 or len(images) != len(where):
        raise ValueError(f"encode_images: got {len(images)} images and {len(where)} names; pass one name "
                         "(the sample id) per image, at least one image")
    inputs = [processor.preprocess_image(image, where=name) for image, name in zip(images, where)]
    device = model.device
    with eval_mode(model):
        vit_tokens = model.encode_vision(torch.cat([x.pixel_values for x in inputs]).to(device))  # [n, t, 4C]
        grounding = model.encode_grounding(torch.stack([x.g_pixel_values for x in inputs]).to(device))
    return ImageFeatures(sizes=[tuple(x.size) for x in inputs], n_tiles=[x.n_tiles for x in inputs],
                         vit_tokens=vit_tokens, tile_start=np.cumsum([0] + [x.n_tiles for x in inputs]).tolist(),
                         grounding=grounding)


def plain_text(tokenizer, ids: Sequence[int], stop_ids: set[int], stop_words: Sequence[str]) -> str:
    """Answer ids → prompt-ready text (see :class:`Answer` ``plain``)."""
    vocab = len(tokenizer)
    kept = [t for t in ids if t not in stop_ids and t < vocab]
    text = tokenizer.decode(kept, skip_special_tokens=True)
    for tag in (*stop_words, IMAGE_PLACEHOLDER, *INTERNVL_SPECIAL_TOKENS, *SA2VA_SPECIAL_TOKENS):
        text = text.replace(tag, " ")
    return " ".join(text.split())


def _prompt_embeds(model, processor, features: ImageFeatures, rows: Sequence[PromptRow]):
    """Left-padded prompt ids → ``inputs_embeds [N, L, D]`` and ``attention [N, L]`` on the model device."""
    prompts = [processor.template_user_turn(row.text) for row in rows]
    input_ids, attention = processor.tokenize_prompts(prompts)  # [N, L]
    device = model.device
    tiles = model.project_vision(features.vit_tokens)  # [Σ n_tiles, t, D]
    fills = []
    for row in rows:
        start, end = features.tile_start[row.image], features.tile_start[row.image + 1]
        cells = None if row.region_cells is None else row.region_cells[None]  # [1, g, g]
        fills.append(model.build_image_embeds(tiles[start:end], cells))
    return model.embed_inputs(input_ids.to(device), fills), attention.to(device)


def _seg_masks(model, features: ImageFeatures, rows: Sequence[PromptRow], embeds: Tensor, attention: Tensor,
               out, seg_positions: list[list[int]], multi_seg: str) -> list[np.ndarray | None]:
    """One bool ``[H, W]`` mask per row with a fed-back ``[SEG]`` (None elsewhere)."""
    masks: list[np.ndarray | None] = [None] * len(rows)
    found = [i for i, positions in enumerate(seg_positions) if positions]
    if not found:
        return masks
    index = torch.tensor(found, device=embeds.device)
    if out.hidden is not None:  # the decoder's own states of the fed-back tokens (upstream reads them from generate)
        hidden = out.hidden[index]  # [M_rows, T, D]
    else:
        hidden = completion_hidden(model.language_model, embeds[index], attention[index], out.ids[index],
                                   out.completion_mask[index])  # [M_rows, T, D]
    keep = {"first": lambda p: p[:1], "union": lambda p: p}[multi_seg]
    seg_hidden, owner = [], []
    for k, i in enumerate(found):
        for t in keep(seg_positions[i]):
            seg_hidden.append(hidden[k, t])
            owner.append(i)
    prompt = model.seg_hidden_to_prompt(torch.stack(seg_hidden))  # [M, C_sam]
    image_index = torch.tensor([rows[i].image for i in owner], device=embeds.device)
    best = model.decode_masks(prompt, features.grounding, image_index).best_logits  # [M, h, w]
    for i, pred_mask in zip(owner, model.logits_to_masks(best, [features.sizes[rows[i].image] for i in owner])):
        pred_mask = pred_mask.cpu().numpy()
        masks[i] = pred_mask if masks[i] is None else masks[i] | pred_mask
    return masks


@torch.no_grad()
def greedy_answers(model, processor, features: ImageFeatures, rows: Sequence[PromptRow], *, max_new_tokens: int,
                   want_masks: bool, multi_seg: str = "first", decode_backend: str = "fast") -> list[Answer]:
    """Greedy answers (and ``[SEG]`` masks when ``want_masks``) of N prompt rows in one batched decode by
    ``decode_backend`` (``'fast'`` | ``'reference'``)."""
    if multi_seg not in MULTI_SEG_RULES:
        raise ValueError(f"multi_seg={multi_seg!r}: expected one of {MULTI_SEG_RULES}")
    if not rows:
        return []
    tok = processor.tokenizer
    with eval_mode(model):
        embeds, attention = _prompt_embeds(model, processor, features, rows)  # [N, L, D], [N, L]
        stop_ids, stop_words = stop_criteria(tok, processor.template.get("STOP_WORDS", []))
        out = decode_completions(model.language_model, embeds, attention, decode_backend=decode_backend,
                                 max_new_tokens=max_new_tokens, do_sample=False, stop_token_ids=stop_ids,
                                 pad_token_id=processor.pad_token_id, **({"return_hidden": True} if want_masks else {}))
        ids_per_row, seg_positions, is_truncated = [], [], []
        for i in range(len(rows)):
            ids = out.ids[i, :int(out.completion_mask[i].sum())].tolist()
            n_decoded = len(ids)
            if stop_words:
                ids = ids[:textual_stop_length(tok, ids, stop_words)]
            is_truncated.append(bool(out.is_truncated[i]) and len(ids) == n_decoded)  # a textual stop ends it
            ids_per_row.append(ids)
            seg_positions.append([t for t, token in enumerate(ids[:-1]) if token == model.seg_token_id])
        masks = [None] * len(rows)
        if want_masks:
            masks = _seg_masks(model, features, rows, embeds, attention, out, seg_positions, multi_seg)
    stop_set = set(stop_ids)
    return [Answer(text=tok.decode(ids, skip_special_tokens=False).strip(),
                   plain=plain_text(tok, ids, stop_set, stop_words), num_tokens=len(ids),
                   is_truncated=is_truncated[i], num_seg=len(seg_positions[i]), pred_mask=masks[i])
            for i, ids in enumerate(ids_per_row)]
