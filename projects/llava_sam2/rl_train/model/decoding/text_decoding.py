"""Token ids ↔ answer text, for every caller of the model pipeline (``model/pipeline/shared.py``).

* :class:`TextDecoding`: the template's stop criteria and the decoder (``decode_backend``), built once per
  processor. Stop words that are one token stop the decode; multi-token ones (``<|end|>`` of ``phi3_chat`` under a
  Qwen tokenizer, reference §8.1) cut the output where the decoded text, ``\\r``/``\\n`` removed, first ends with
  them (upstream's textual criterion).
* :func:`sample_text`: G sampled (or one greedy) completions of each prompt row, in chunks of whole groups, by
  the chosen decoder (``model.decoding.fast_generation.DECODE_BACKENDS``; the fast path by default), then the textual
  cut, then (``TextDecoding.completion_length_multiple``) right padding to a bucketed length.
* :func:`answer_texts` (upstream ``prediction``: ``decode(ids, skip_special_tokens=False).strip()``) and
  :func:`completion_texts` (the answer as prompt text for a partner model: stop tokens, special tokens, stop words
  and Sa2VA/InternVL tags removed, whitespace collapsed).
* :func:`fed_back_seg_positions`: the ``[SEG]`` tokens that have a hidden state (upstream ``predict_forward``
  reads states of tokens fed back to the model, so a ``[SEG]`` emitted as the last token has none, §4.4, §8.7).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from ..text.constants import IMAGE_PLACEHOLDER, INTERNVL_SPECIAL_TOKENS, SA2VA_SPECIAL_TOKENS
from ..text.lengths import bucket_length, check_length_multiple
from .fast_generation import DECODE_BACKENDS, decode_completions
from .generation import Completions, SharedPrefix


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


@dataclass(frozen=True)
class TextDecoding:
    """How answers are decoded and where they end (the template's stop words).

    Attributes:
        tokenizer: the processor's tokenizer.
        stop_token_ids: EOS plus every single-token stop word; decoding stops on them.
        stop_words: stop words the tokenizer splits into several tokens; an answer is cut where its decoded text
            first ends with one.
        pad_token_id: fed after a row has stopped.
        decode_backend: the decoder, a key of ``model.decoding.fast_generation.DECODE_BACKENDS`` (``'fast'`` | ``'reference'``).
        completion_length_multiple: :func:`sample_text` right-pads its completions ``[N, T]`` to a multiple of this
            (at most ``max_new_tokens``), so the teacher-forced passes over them see a few lengths; None: T is the
            longest completion.
    """

    tokenizer: object
    stop_token_ids: tuple[int, ...]
    stop_words: tuple[str, ...]
    pad_token_id: int
    decode_backend: str = "fast"
    completion_length_multiple: int | None = None

    def __post_init__(self) -> None:
        if self.decode_backend not in DECODE_BACKENDS:
            raise ValueError(f"TextDecoding: decode_backend={self.decode_backend!r} is not one of "
                             f"{sorted(DECODE_BACKENDS)}; use 'fast' or 'reference'.")
        check_length_multiple("TextDecoding: completion_length_multiple", self.completion_length_multiple)

    @classmethod
    def from_processor(cls, processor, decode_backend: str = "fast",
                       completion_length_multiple: int | None = None) -> "TextDecoding":
        ids, words = stop_criteria(processor.tokenizer, processor.template.get("STOP_WORDS", []))
        return cls(processor.tokenizer, tuple(ids), tuple(words), int(processor.pad_token_id), decode_backend,
                   completion_length_multiple)


def group_chunks(num_groups: int, group_size: int, chunk_size: int | None) -> list[tuple[int, int]]:
    """Prompt ranges ``[b0, b1)`` so that one call holds at most ``chunk_size`` rows (whole groups, at least one)."""
    per_call = num_groups if chunk_size is None else max(1, chunk_size // group_size)
    return [(b0, min(b0 + per_call, num_groups)) for b0 in range(0, num_groups, per_call)]


def _pad_cat(parts: list[Completions], pad_token_id: int, length: int = 0) -> Completions:
    """Concatenate completion chunks along rows, right-padding to the longest T (at least ``length``)."""
    T = max(length, *(p.ids.shape[1] for p in parts))

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


def pad_completions(completions: Completions, length: int, pad_token_id: int) -> Completions:
    """``completions`` right-padded to ``length`` columns: pad ids, mask False, log-prob 0 (hidden 0), so every
    masked sum over them is unchanged."""
    if completions.ids.shape[1] >= length:
        return completions
    return _pad_cat([completions], pad_token_id, length)


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
                return_hidden: bool = False, prefix: SharedPrefix | None = None) -> Completions:
    """G = ``num_generations`` completions of each distinct prompt row ``[b, L, D]`` (left padded): ``b * G`` rows,
    row ``r * G + g`` the g-th of prompt r, decoded by ``decoding.decode_backend`` with at most ``chunk_size`` rows
    (whole groups) per call, then cut at the textual stop words. ``do_sample=False`` is the greedy answer.
    ``return_hidden`` asks the decoder for the fed-back tokens' states (``Completions.hidden``; a decoder may
    leave it None). With ``prefix`` the rows are the prompts' own tokens after a shared prefix
    (``generation.SharedPrefix``: the image block, prefilled once per image by the fast path)."""
    G = num_generations

    def extra(b0: int, b1: int) -> dict:
        return {**({"return_hidden": True} if return_hidden else {}),
                **({"prefix": prefix.rows(b0, b1)} if prefix is not None else {})}

    parts = [decode_completions(model.language_model, embeds[b0:b1], attention[b0:b1],
                                decode_backend=decoding.decode_backend, num_generations=G,
                                max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                do_sample=do_sample, stop_token_ids=list(decoding.stop_token_ids),
                                pad_token_id=decoding.pad_token_id, generator=generator, **extra(b0, b1))
             for b0, b1 in group_chunks(embeds.shape[0], G, chunk_size)]
    return joined_completions(parts, decoding, max_new_tokens)


def joined_completions(parts: list[Completions], decoding: TextDecoding, max_new_tokens: int) -> Completions:
    """A sampler's decoded chunks as one batch: rows concatenated, cut at the textual stop words, then right padded
    to the bucketed length (``decoding.completion_length_multiple``, at most ``max_new_tokens``)."""
    out = cut_at_stop_words(_pad_cat(parts, decoding.pad_token_id), decoding)
    length = bucket_length(out.ids.shape[1], decoding.completion_length_multiple, cap=max_new_tokens)
    return pad_completions(out, length, decoding.pad_token_id)


def clean_text(text: str, stop_words: Sequence[str] = ()) -> str:
    """Text as a prompt for another model: ``stop_words``, Sa2VA's tags and ``<image>`` removed (they would add
    image slots to the partner's prompt), whitespace collapsed."""
    for tag in (*stop_words, IMAGE_PLACEHOLDER, *INTERNVL_SPECIAL_TOKENS, *SA2VA_SPECIAL_TOKENS):
        text = text.replace(tag, " ")
    return " ".join(text.split())


def host_completions(completions: Completions) -> Completions:
    """``completions`` with ``ids``, ``completion_mask`` and ``is_truncated`` copied to the host in one device read
    (``token_logp`` and ``hidden`` stay where they are); the text helpers below then read no device values."""
    ids, T = completions.ids, completions.ids.shape[1]
    packed = torch.cat([ids, completions.completion_mask.to(ids.dtype),
                        completions.is_truncated.to(ids.dtype)[:, None]], dim=1).cpu()  # [N, 2T + 1]
    return replace(completions, ids=packed[:, :T], completion_mask=packed[:, T:2 * T].bool(),
                   is_truncated=packed[:, 2 * T].bool())


def completion_texts(completions: Completions, decoding: TextDecoding) -> list[str]:
    """Each row as prompt text: decoded without stop tokens, special tokens or ids beyond the tokenizer (padded
    vocab), then :func:`clean_text` (which also drops the textual stop words)."""
    tokenizer, stops, vocab = decoding.tokenizer, set(decoding.stop_token_ids), len(decoding.tokenizer)
    texts = []
    for ids, is_active in zip(completions.ids.tolist(), completions.completion_mask.tolist()):
        kept = [t for t, a in zip(ids, is_active) if a and t not in stops and t < vocab]
        texts.append(clean_text(tokenizer.decode(kept, skip_special_tokens=True), decoding.stop_words))
    return texts


def answer_texts(completions: Completions, decoding: TextDecoding) -> list[str]:
    """Each row as upstream's ``prediction``: ``decode(ids, skip_special_tokens=False).strip()`` (stop token kept)."""
    lengths = completions.completion_mask.sum(-1).tolist()  # [N]
    return [decoding.tokenizer.decode(ids[:n], skip_special_tokens=False).strip()
            for ids, n in zip(completions.ids.tolist(), lengths)]


def fed_back_seg_positions(completions: Completions, seg_token_id: int) -> list[list[int]]:
    """Per row, the positions t of ``[SEG]`` tokens followed by another generated token (so their state exists)."""
    lengths = completions.completion_mask.sum(-1).tolist()  # [N]
    return [[t for t, token in enumerate(ids[:max(n - 1, 0)]) if token == seg_token_id]
            for ids, n in zip(completions.ids.tolist(), lengths)]
