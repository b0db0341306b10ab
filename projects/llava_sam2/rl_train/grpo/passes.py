"""Model passes shared by the two cycle loops: prompt embeddings, chunked sampling, completion text, and the EMA
partner's two tasks (segment a caption: loop 1; describe a mask: loop 2).

Every function takes the weights in effect as they are: the caller enters ``WeightSets.partner`` /
``WeightSets.reference`` around it and passes ``tile_embeds = model.project_vision(features.vit_tokens)``
computed inside that block (``mlp1`` is one of the swapped tensors). Rows are batched; ``chunk_size`` caps the
rows of one model call (``GRPOConfig.generation_chunk_size``). Text is decoded by ``TextDecoding.decode_backend``
(``GRPOConfig.decode_backend``): the fast path (``model.fast_generation``) by default, which takes the distinct
prompts plus the group size and prefills each prompt once for its G samples.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from ..model.fast_generation import DECODE_BACKENDS, decode_completions
from ..model.generation import Completions, completion_hidden
from ..model.inference import stop_criteria, textual_stop_length
from .features import StepFeatures, image_fills


@dataclass(frozen=True)
class TextDecoding:
    """How sampled token ids end and become text (the template's stop words, as ``predict`` uses them).

    Attributes:
        tokenizer: the processor's tokenizer.
        stop_token_ids: EOS plus every single-token stop word; decoding stops on them.
        stop_words: stop words the tokenizer splits into several tokens (``<|end|>`` of ``phi3_chat`` under a Qwen
            tokenizer, reference §8.1); a completion is cut where its decoded text first ends with one.
        pad_token_id: fed after a row has stopped.
        decode_backend: the decoder, a key of ``model.fast_generation.DECODE_BACKENDS`` (``'fast'`` | ``'reference'``).
    """

    tokenizer: object
    stop_token_ids: tuple[int, ...]
    stop_words: tuple[str, ...]
    pad_token_id: int
    decode_backend: str = "fast"

    def __post_init__(self) -> None:
        if self.decode_backend not in DECODE_BACKENDS:
            raise ValueError(f"TextDecoding: decode_backend={self.decode_backend!r} is not one of "
                             f"{sorted(DECODE_BACKENDS)}; use 'fast' or 'reference'.")

    @classmethod
    def from_processor(cls, processor, decode_backend: str = "fast") -> "TextDecoding":
        ids, words = stop_criteria(processor.tokenizer, processor.template.get("STOP_WORDS", []))
        return cls(processor.tokenizer, tuple(ids), tuple(words), int(processor.pad_token_id), decode_backend)


def group_chunks(num_groups: int, group_size: int, chunk_size: int | None) -> list[tuple[int, int]]:
    """Prompt ranges ``[b0, b1)`` so that one call holds at most ``chunk_size`` rows (whole groups, at least one)."""
    per_call = num_groups if chunk_size is None else max(1, chunk_size // group_size)
    return [(b0, min(b0 + per_call, num_groups)) for b0 in range(0, num_groups, per_call)]


def slice_rows(data, r0: int, r1: int):
    """Rows ``[r0, r1)`` of every tensor field of a replay dataclass (``CaptionReplay`` / ``MaskReplay``)."""
    return replace(data, **{f.name: getattr(data, f.name)[r0:r1] for f in fields(data)})


def cat_chunks(fn: Callable[[int, int], Tensor], num_groups: int, group_size: int, chunk_size: int | None) -> Tensor:
    """``cat([fn(b0, b1) for each chunk], 0)``; ``fn`` returns rows ``[(b1 - b0) * G, ...]``."""
    return torch.cat([fn(b0, b1) for b0, b1 in group_chunks(num_groups, group_size, chunk_size)], dim=0)


def prompt_embeds(model, features: StepFeatures, tile_embeds: Tensor, prompt_ids: Tensor, images: Sequence[int],
                  region_cells: Sequence[Tensor | None] | None = None) -> Tensor:
    """``inputs_embeds [n, L, D]`` of left-padded prompts ``[n, L]`` with their image (and region) tokens."""
    return model.embed_inputs(prompt_ids, image_fills(model, features, tile_embeds, images, region_cells))


def _pad_cat(parts: list[Completions], pad_token_id: int) -> Completions:
    """Concatenate completion chunks along rows, right-padding to the longest T."""
    T = max(p.ids.shape[1] for p in parts)

    def pad(x: Tensor, value) -> Tensor:
        return torch.nn.functional.pad(x, (0, T - x.shape[1]), value=value)  # [n, T]

    hidden = None
    if all(p.hidden is not None for p in parts):
        hidden = torch.cat([torch.nn.functional.pad(p.hidden, (0, 0, 0, T - p.hidden.shape[1])) for p in parts])
    return Completions(
        ids=torch.cat([pad(p.ids, pad_token_id) for p in parts]),
        completion_mask=torch.cat([pad(p.completion_mask, False) for p in parts]),
        is_truncated=torch.cat([p.is_truncated for p in parts]),
        token_logp=torch.cat([pad(p.token_logp, 0.0) for p in parts]),
        hidden=hidden,  # [n, T, D] or None
    )


def cut_at_stop_words(completions: Completions, decoding: TextDecoding) -> Completions:
    """Apply the multi-token stop words: keep each row up to where its decoded text first ends with one."""
    if not decoding.stop_words:
        return completions
    lengths = completions.completion_mask.sum(-1).tolist()  # [N]
    cut = []
    for row, n in enumerate(lengths):
        ids = completions.ids[row, :n].tolist()
        text = decoding.tokenizer.decode(ids, skip_special_tokens=False).replace("\r", "").replace("\n", "")
        is_stopped = any(word in text for word in decoding.stop_words)  # one decode; the scan below is O(T^2)
        cut.append(textual_stop_length(decoding.tokenizer, ids, decoding.stop_words) if is_stopped else n)
    new_lengths = torch.tensor(cut, device=completions.ids.device)  # [N]
    T = max(1, max(cut))
    completion_mask = torch.arange(T, device=new_lengths.device)[None] < new_lengths[:, None]  # [N, T]
    was_cut = new_lengths < torch.tensor(lengths, device=new_lengths.device)  # [N]
    return Completions(ids=completions.ids[:, :T], completion_mask=completion_mask,
                       is_truncated=completions.is_truncated & ~was_cut,
                       token_logp=completions.token_logp[:, :T].masked_fill(~completion_mask, 0.0),
                       hidden=None if completions.hidden is None else completions.hidden[:, :T])


@torch.no_grad()
def sample_text(model, embeds: Tensor, attention: Tensor, decoding: TextDecoding, *, max_new_tokens: int,
                do_sample: bool, num_generations: int = 1, temperature: float = 1.0, top_p: float = 1.0,
                chunk_size: int | None = None, generator: torch.Generator | None = None,
                return_hidden: bool = False) -> Completions:
    """G = ``num_generations`` completions of each distinct prompt row ``[b, L, D]`` (left padded): ``b * G`` rows,
    row ``r * G + g`` the g-th of prompt r, decoded by ``decoding.decode_backend`` with at most ``chunk_size`` rows
    (whole groups) per call, then cut at the textual stop words. ``return_hidden`` asks the decoder for the fed-back
    tokens' states (``Completions.hidden``; a decoder may leave it None)."""
    G = num_generations
    extra = {"return_hidden": True} if return_hidden else {}
    parts = [decode_completions(model.language_model, embeds[b0:b1], attention[b0:b1],
                                decode_backend=decoding.decode_backend, num_generations=G,
                                max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                do_sample=do_sample, stop_token_ids=list(decoding.stop_token_ids),
                                pad_token_id=decoding.pad_token_id, generator=generator, **extra)
             for b0, b1 in group_chunks(embeds.shape[0], G, chunk_size)]
    return cut_at_stop_words(_pad_cat(parts, decoding.pad_token_id), decoding)


def clean_text(text: str) -> str:
    """A sampled caption as prompt text: Sa2VA's tags and ``<image>`` removed (they would add image slots to the
    partner's prompt), whitespace collapsed."""
    from ..model.constants import IMAGE_PLACEHOLDER, INTERNVL_SPECIAL_TOKENS, SA2VA_SPECIAL_TOKENS

    for tag in (IMAGE_PLACEHOLDER, *INTERNVL_SPECIAL_TOKENS, *SA2VA_SPECIAL_TOKENS):
        text = text.replace(tag, " ")
    return " ".join(text.split())


def completion_texts(completions: Completions, decoding: TextDecoding) -> list[str]:
    """Decoded text of each row without stop tokens, special tokens or ids beyond the tokenizer (padded vocab)."""
    tokenizer, stops, vocab = decoding.tokenizer, set(decoding.stop_token_ids), len(decoding.tokenizer)
    texts = []
    for ids, is_active in zip(completions.ids.tolist(), completions.completion_mask.tolist()):
        kept = [t for t, a in zip(ids, is_active) if a and t not in stops and t < vocab]
        texts.append(clean_text(tokenizer.decode(kept, skip_special_tokens=True)))
    return texts


def first_fed_back_seg(completions: Completions, seg_token_id: int) -> tuple[Tensor, Tensor]:
    """Position of the first ``[SEG]`` that is followed by another generated token, and whether one exists.

    Upstream ``predict_forward`` takes ``[SEG]`` states from tokens fed back to the model, so a ``[SEG]`` emitted as
    the last token yields no mask (reference §4.4, §8.7); ``model.inference.predict`` does the same.
    Returns ``index [n]`` long and ``has_seg [n]`` bool.
    """
    ids, completion_mask = completions.ids, completions.completion_mask  # [n, T]
    lengths = completion_mask.sum(-1, keepdim=True)  # [n, 1]
    positions = torch.arange(ids.shape[1], device=ids.device)[None]  # [1, T]
    is_seg = (ids == seg_token_id) & (positions < lengths - 1)  # [n, T]
    return is_seg.int().argmax(-1), is_seg.any(-1)


@torch.no_grad()
def partner_segment(model, processor, features: StepFeatures, tile_embeds: Tensor, captions: Sequence[str],
                    images: Sequence[int], decoding: TextDecoding, *, max_new_tokens: int,
                    chunk_size: int | None) -> tuple[list[Tensor], dict[str, float]]:
    """Loop 1's second half: ground each caption with the weights in effect (the EMA partner).

    Per caption: RES prompt (``processor.segment_prompt``) → GREEDY answer of at most ``max_new_tokens`` → the
    final-norm hidden state at its first fed-back ``[SEG]`` (kept by the decoder when it fed the token back, as
    upstream ``predict_forward`` does; else from one teacher-forced pass) → ``text_hidden_fcs`` →
    SAM2 (best of multimask) → bool mask at image size (``model.logits_to_masks``). An empty caption or an answer
    without ``[SEG]`` gives an all-False mask (IoU 0 against a non-empty gt_mask), counted in the stats.

    Returns N bool ``[H, W]`` CPU masks and counts ``partner/empty_caption``, ``partner/no_seg``,
    ``partner/answer_tokens`` (mean answer length).
    """
    sizes = [features.image_sizes[i] for i in images]
    pred_masks = [torch.zeros(size, dtype=torch.bool) for size in sizes]
    valid = [n for n, caption in enumerate(captions) if caption]
    num_no_seg, answer_tokens = 0, 0.0
    step = len(valid) if chunk_size is None else chunk_size
    device = model.device
    for r in range(0, len(valid), max(1, step)):
        rows = valid[r:r + step]
        ids, attention = processor.tokenize_prompts(
            [processor.segment_prompt(features.n_tiles(images[n]), captions[n]) for n in rows])
        ids, attention = ids.to(device), attention.to(device)
        embeds = prompt_embeds(model, features, tile_embeds, ids, [images[n] for n in rows])  # [n, L, D]
        answer = sample_text(model, embeds, attention, decoding, max_new_tokens=max_new_tokens, do_sample=False,
                             return_hidden=True)
        answer_tokens += float(answer.completion_mask.sum())
        hidden = answer.hidden  # [n, T, D]: the decode's own [SEG] states, as upstream predict_forward reads them
        if hidden is None:  # a decoder without states: one teacher-forced pass over prompt + answer
            hidden = completion_hidden(model.language_model, embeds, attention, answer.ids, answer.completion_mask)
        seg_index, has_seg = first_fed_back_seg(answer, model.seg_token_id)  # [n], [n]
        num_no_seg += int((~has_seg).sum())
        found = has_seg.nonzero().squeeze(-1)  # [M]
        if found.numel() == 0:
            continue
        seg_prompt = model.seg_hidden_to_prompt(hidden[found, seg_index[found]])  # [M, C_sam]
        chosen = [rows[k] for k in found.tolist()]
        image_index = torch.tensor([images[n] for n in chosen], device=device)
        best_logits = model.decode_masks(seg_prompt, features.grounding, image_index).best_logits  # [M, h, w]
        for n, pred_mask in zip(chosen, model.logits_to_masks(best_logits, [sizes[n] for n in chosen])):
            pred_masks[n] = pred_mask.cpu()
    stats = {"partner/empty_caption": float(len(captions) - len(valid)), "partner/no_seg": float(num_no_seg),
             "partner/answer_tokens": answer_tokens / max(1, len(valid))}
    return pred_masks, stats


@torch.no_grad()
def partner_describe(model, processor, features: StepFeatures, tile_embeds: Tensor, pred_masks: Sequence[Tensor],
                     images: Sequence[int], sample_ids: Sequence[str], decoding: TextDecoding, *,
                     max_new_tokens: int, chunk_size: int | None) -> tuple[list[str], dict[str, float]]:
    """Loop 2's second half: describe each sampled mask with the weights in effect (the EMA partner).

    Per mask: region cells (upstream nearest sampling; a non-empty mask that hits no sample point gets the one
    cell it covers most, ``empty_region='dilate_to_one_cell'``, so every non-empty action is shown to the partner)
    → region-caption prompt → GREEDY caption of at most ``max_new_tokens``. An all-False mask gets the caption
    ``""`` (no region to describe: the caption rewards score it as a bad description), counted in the stats.

    Returns N captions and counts ``partner/empty_mask``, ``partner/caption_tokens`` (mean length).
    """
    captions = [""] * len(pred_masks)
    valid = [n for n, m in enumerate(pred_masks) if bool(m.any())]
    caption_tokens = 0.0
    step = len(valid) if chunk_size is None else chunk_size
    device = model.device
    for r in range(0, len(valid), max(1, step)):
        rows = valid[r:r + step]
        cells = [processor.region_cells(pred_masks[n], sample_id=sample_ids[n], size=features.image_sizes[images[n]],
                                        empty_region="dilate_to_one_cell") for n in rows]
        ids, attention = processor.tokenize_prompts(
            [processor.caption_prompt(features.n_tiles(images[n]), c) for n, c in zip(rows, cells)])
        embeds = prompt_embeds(model, features, tile_embeds, ids.to(device), [images[n] for n in rows], cells)
        out = sample_text(model, embeds, attention.to(device), decoding, max_new_tokens=max_new_tokens,
                          do_sample=False)
        caption_tokens += float(out.completion_mask.sum())
        for n, text in zip(rows, completion_texts(out, decoding)):
            captions[n] = text
    stats = {"partner/empty_mask": float(len(pred_masks) - len(valid)),
             "partner/caption_tokens": caption_tokens / max(1, len(valid))}
    return captions, stats
