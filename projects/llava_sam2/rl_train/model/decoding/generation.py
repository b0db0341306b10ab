"""Sampling and teacher-forced scoring for any transformers causal LM fed with ``inputs_embeds``.

Two functions carry the RL policy's text side:

* :func:`sample_completions` — the reference decode loop (prefill + one token per step with a
  ``DynamicCache``). It is deliberately plain so that a faster decoder can be checked against it.
* :func:`completion_logprobs` — one teacher-forced forward over ``prompt + completion`` that returns
  the per-token log-probabilities and, optionally, the final-norm hidden states that Sa2VA turns
  into ``[SEG]`` prompts (``docs/architecture.md``, docs/sa2va_internals.md §8.2). The head runs over the completion in
  chunks of positions (:func:`token_logprobs`), or over its real tokens only (``logprob_head='fused'``,
  head_logprob.py), so a pass never holds all ``[N, T, V]`` fp32 logits;
  :func:`completion_hidden` skips the head for passes that only need the ``[SEG]`` states.

Both run the LM's decoder body and its output head separately, so logits are computed only where
a token is scored (never over the whole prompt). They work on a bare ``*ForCausalLM`` and on a
peft-wrapped one (LoRA layers live inside the body, so ``disable_adapter()`` applies as usual).
Neither switches train/eval mode: call ``lm.eval()`` for dropout-free rollouts.

Layout: prompts are LEFT padded (``prompt_attention[:, -1]`` all True), completions RIGHT padded
(``completion_mask`` is True on a prefix of each row). Position ids are ``cumsum(attention) - 1``
with padded positions clamped to 0 (they are masked out of attention anyway).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache, TopPLogitsWarper

from .head_logprob import fused_token_logprobs


@dataclass
class Completions:
    """A batch of sampled completions.

    Attributes:
        ids: ``[N, T]`` long; the sampled tokens, ``pad_token_id`` after a row's stop token.
        completion_mask: ``[N, T]`` bool; True up to and including the stop token.
        is_truncated: ``[N]`` bool; True where no stop token came within ``max_new_tokens``.
        token_logp: ``[N, T]`` float32; ``log softmax(logits / temperature)`` of each sampled token
            as computed by the cached decode (before top-p filtering), 0 where masked. Diagnostic:
            a policy-gradient ratio should use :func:`completion_logprobs`, which recomputes it
            with the same kernel as the training forward.
        hidden: ``[N, T, D]`` (the LM's dtype) or None; when the decoder was asked for it
            (``return_hidden``), the final-norm state at the position whose input is ``ids[:, t]``, as
            the decode computed it when feeding that token back (what :func:`completion_hidden` returns, up
            to float reordering; upstream ``predict_forward`` reads ``[SEG]`` states from ``generate`` the
            same way). 0 for the last column, which was never fed back.
    """

    ids: torch.Tensor
    completion_mask: torch.Tensor
    is_truncated: torch.Tensor
    token_logp: torch.Tensor
    hidden: torch.Tensor | None = None


@dataclass
class SharedPrefix:
    """Prompt rows that begin with a shared block (e.g. the image block of rows about one image).

    Row r's prompt is ``[prefix index[r] | the row's own tokens]``; a decoder that knows this prefills each distinct
    prefix once (``fast_generation``), any other decoder is given :meth:`full_prompts`. Padding inside the joined
    prompt is masked out and positions count only real tokens (``position_ids_from_attention``), so a joined row
    scores as its plain left-padded prompt does, up to float reordering.

    Attributes:
        embeds: ``[U, P, D]`` the U distinct prefixes, LEFT padded; attention: ``[U, P]`` (last column all True).
        index: ``[n]`` long, the prefix of each row.
    """

    embeds: torch.Tensor
    attention: torch.Tensor
    index: torch.Tensor

    def full_prompts(self, embeds: torch.Tensor, attention: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[prefix | rest]`` of every row: ``[n, S, D]``, ``[n, S]`` → ``[n, P + S, D]``, ``[n, P + S]`` (long)."""
        return (torch.cat([self.embeds[self.index].to(embeds.dtype), embeds], dim=1),
                torch.cat([self.attention[self.index].long(), attention.long()], dim=1))

    def rows(self, r0: int, r1: int) -> "SharedPrefix":
        """The prefix of rows ``[r0, r1)`` alone (only the prefixes they use, re-indexed)."""
        if r0 == 0 and r1 >= len(self.index):
            return self
        used, index = torch.unique(self.index[r0:r1], return_inverse=True)  # [u], [r1 - r0]
        return SharedPrefix(self.embeds[used], self.attention[used], index)


def position_ids_from_attention(attention_mask: torch.Tensor) -> torch.Tensor:
    """``position_ids = clamp(cumsum(attention_mask) - 1, min=0)`` per row; ``[N, L]`` → ``[N, L]``."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def continuation_positions(prompt_positions: torch.Tensor, length: int, num_generations: int = 1) -> torch.Tensor:
    """Positions of ``length`` text tokens that continue prompts whose positions are given: each row goes on from its
    largest prompt position + 1, one per token (a left-padded 1-D row: its real-token count onwards; a Qwen-VL M-RoPE
    row ``[3, B, L]``: past the image's largest index, the same on all three axes). Rows are repeated
    ``num_generations`` times (row ``b·G + g`` continues prompt b).

    ``[B, L]`` → ``[B·G, length]``; ``[3, B, L]`` → ``[3, B·G, length]``.
    """
    start = prompt_positions.amax(dim=-1) + 1  # [B] or [3, B]
    if start.dim() == 2:
        start = start.amax(dim=0, keepdim=True).expand_as(start)  # every axis continues from the largest
    steps = torch.arange(length, device=prompt_positions.device)  # [length]
    return (start.repeat_interleave(num_generations, dim=-1)[..., None] + steps).long()


def decoder_and_head(lm: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The decoder body (returns final-norm ``last_hidden_state``) and the output head of ``lm``.

    ``get_decoder()`` exists on the transformers LMs Sa2VA uses (Qwen2, Llama, Phi3) and passes
    through a peft wrapper; remote-code LMs without it fall back to their ``.model`` attribute.
    """
    body = lm.get_decoder() if hasattr(lm, "get_decoder") else getattr(lm, "model", None)
    head = lm.get_output_embeddings()
    if body is None or head is None:
        raise TypeError(
            f"generation: {type(lm).__name__} exposes no decoder body (get_decoder() / .model) or no "
            "output head (get_output_embeddings()); pass a transformers *ForCausalLM (optionally "
            "peft-wrapped)."
        )
    return body, head


def _check_prompt(inputs_embeds: torch.Tensor, attention_mask: torch.Tensor, name: str) -> None:
    if inputs_embeds.dim() != 3 or attention_mask.shape != inputs_embeds.shape[:2]:
        raise ValueError(
            f"generation: {name} embeddings must be [N, L, D] with an attention mask [N, L]; got "
            f"{tuple(inputs_embeds.shape)} and {tuple(attention_mask.shape)}."
        )
    if not bool(attention_mask[:, -1].all()):
        raise ValueError(
            f"generation: {name} attention mask is not left padded (some rows end with padding); "
            "tokenize prompts with padding_side='left' (Sa2VAProcessor.tokenize_prompts does)."
        )


def check_group_size(where: str, num_generations: int) -> None:
    if not isinstance(num_generations, int) or num_generations < 1:
        raise ValueError(f"{where}: num_generations must be an int >= 1 (G samples per prompt); "
                         f"got {num_generations!r}.")


def check_sampling_args(where: str, *, max_new_tokens: int, temperature: float, top_p: float,
                        stop_token_ids: Sequence[int], stop_check_interval: int) -> None:
    """The sampling arguments every decoder takes (``DECODE_BACKENDS``), checked by this one function for all."""
    if max_new_tokens < 1 or temperature <= 0 or not 0 < top_p <= 1 or stop_check_interval < 1:
        raise ValueError(
            f"{where}: need max_new_tokens >= 1, temperature > 0, 0 < top_p <= 1 and "
            f"stop_check_interval >= 1; got max_new_tokens={max_new_tokens}, temperature={temperature}, "
            f"top_p={top_p}, stop_check_interval={stop_check_interval}."
        )
    if len(stop_token_ids) == 0:
        raise ValueError(f"{where}: stop_token_ids is empty; pass the template's stop ids.")


def _next_token(
    logits: torch.Tensor,
    *,
    do_sample: bool,
    top_p: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Pick one token per row from temperature-scaled logits ``[N, V]`` → ``[N]``.

    Greedy = argmax; sampling = multinomial over ``softmax(top_p_filter(logits))``, with the
    nucleus filter taken from transformers (``TopPLogitsWarper``) so it matches ``generate``.
    """
    if not do_sample:
        return logits.argmax(-1)
    if top_p < 1.0:
        logits = TopPLogitsWarper(top_p)(None, logits)
    probs = logits.softmax(-1)  # [N, V]
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # [N]


@torch.no_grad()
def sample_completions(
    lm: nn.Module,
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    do_sample: bool = True,
    stop_token_ids: list[int] | tuple[int, ...],
    pad_token_id: int = 0,
    generator: torch.Generator | None = None,
    stop_check_interval: int = 8,
    return_hidden: bool = False,
    prompt_positions: torch.Tensor | None = None,
    prefill_kwargs: dict | None = None,
) -> Completions:
    """Decode up to ``max_new_tokens`` tokens per row with a KV cache.

    Step t: ``logits_t = head(body(e_t | cache))[:, -1] / temperature``; the next token is the
    argmax (``do_sample=False``) or a draw from the top-p-filtered softmax. A row is finished
    once it emits a token in ``stop_token_ids``; afterwards it keeps feeding ``pad_token_id``
    (masked out of ``completion_mask``). ``all finished`` is checked on the host only every
    ``stop_check_interval`` steps, and the output is trimmed to the longest row.

    Args:
        lm: a transformers causal LM, possibly peft-wrapped.
        inputs_embeds: ``[N, L, D]`` prompt embeddings (e.g. ``Sa2VAModel.embed_inputs``).
        attention_mask: ``[N, L]``, LEFT padded.
        generator: RNG for the multinomial draws (seeded rollouts).
        return_hidden: also keep each fed-back token's final-norm state (``Completions.hidden``).
        prompt_positions: a family's own prompt positions (Qwen-VL's M-RoPE ``[3, N, L]``); the generated tokens go
            on from each row's largest (:func:`continuation_positions`). None: 1-D positions over the attention.
        prefill_kwargs: extra keyword arguments of the decoder body at the prefill step only (Qwen3-VL's
            ``visual_pos_masks`` and ``deepstack_visual_embeds``).
    """
    check_sampling_args("sample_completions", max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                        stop_token_ids=stop_token_ids, stop_check_interval=stop_check_interval)
    _check_prompt(inputs_embeds, attention_mask, "prompt")
    body, head = decoder_and_head(lm)
    embed_tokens = lm.get_input_embeddings()
    N, L, _ = inputs_embeds.shape
    device = inputs_embeds.device
    stop_ids = torch.as_tensor(list(stop_token_ids), device=device)

    cache = DynamicCache()
    attention = attention_mask.long()  # [N, L + t]
    if prompt_positions is None:
        position_ids = position_ids_from_attention(attention)  # [N, L] at prefill, then [N, 1]
        next_positions = None
    else:
        position_ids = prompt_positions  # [3, N, L] at prefill, then [3, N, 1]
        next_positions = continuation_positions(prompt_positions, max_new_tokens)  # [3, N, max_new_tokens]
    step_embeds = inputs_embeds  # [N, L, D] at prefill, then [N, 1, D]
    is_finished = torch.zeros(N, dtype=torch.bool, device=device)
    ids, logps, actives, fed_hidden = [], [], [], []
    for step in range(max_new_tokens):
        hidden = body(
            inputs_embeds=step_embeds, attention_mask=attention, position_ids=position_ids,
            past_key_values=cache, use_cache=True, **((prefill_kwargs or {}) if step == 0 else {}),
        ).last_hidden_state[:, -1]  # [N, D]
        if step == 0 and cache.get_seq_length() != L:
            raise RuntimeError(
                "sample_completions: the LM did not fill the KV cache (some LMs skip it under "
                "gradient checkpointing in train mode); call lm.eval() before sampling."
            )
        if return_hidden and step > 0:
            fed_hidden.append(hidden)  # the state of input c_{step-1}
        logits = head(hidden).float() / temperature  # [N, V]
        token = _next_token(logits, do_sample=do_sample, top_p=top_p, generator=generator)  # [N]
        is_active = ~is_finished
        token = torch.where(is_active, token, torch.full_like(token, pad_token_id))
        token_logp = logits.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)  # [N]
        ids.append(token)
        logps.append(token_logp.masked_fill(~is_active, 0.0))
        actives.append(is_active)
        is_finished = is_finished | (is_active & torch.isin(token, stop_ids))
        if (step + 1) % stop_check_interval == 0 and bool(is_finished.all()):
            break
        attention = torch.cat([attention, attention.new_ones(N, 1)], dim=1)  # [N, L + t + 1]
        position_ids = position_ids[:, -1:] + 1 if next_positions is None else \
            next_positions[..., step:step + 1]  # [N, 1] or [3, N, 1]: the input c_step
        step_embeds = embed_tokens(token)[:, None].to(inputs_embeds.dtype)  # [N, 1, D]

    completion_mask = torch.stack(actives, dim=1)  # [N, T_run]
    T = int(completion_mask.sum(-1).max())  # rows are prefix-masked, so this is the longest row
    hidden_out = None
    if return_hidden:  # the last chosen token was never fed back: its state stays 0
        hidden_out = torch.stack(fed_hidden + [torch.zeros_like(hidden)], dim=1)[:, :T]  # [N, T, D]
    return Completions(
        ids=torch.stack(ids, dim=1)[:, :T],
        completion_mask=completion_mask[:, :T],
        is_truncated=~is_finished,
        token_logp=torch.stack(logps, dim=1)[:, :T],
        hidden=hidden_out,
    )


# fp32 logits one head call may hold (N·t·V·4 bytes); longer completions are scored in chunks of t positions.
# At N=64, V=151,936 that is t=27 positions, ~1 GiB, instead of ~5 GiB for T=128 at once.
MAX_LOGIT_BYTES = 2**30


def _check_completion(prompt_embeds: torch.Tensor, prompt_attention: torch.Tensor, completion_ids: torch.Tensor,
                      completion_mask: torch.Tensor, who: str) -> None:
    _check_prompt(prompt_embeds, prompt_attention, "prompt")
    if completion_ids.dim() != 2 or completion_ids.shape != completion_mask.shape or \
            completion_ids.shape[0] != prompt_embeds.shape[0]:
        raise ValueError(
            f"{who}: completion_ids and completion_mask must both be [N, T] with N = "
            f"{prompt_embeds.shape[0]} prompts; got {tuple(completion_ids.shape)} and "
            f"{tuple(completion_mask.shape)}."
        )


def _teacher_forced_hidden(lm: nn.Module, prompt_embeds: torch.Tensor, prompt_attention: torch.Tensor,
                           completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Final-norm hidden states ``[N, L + T, D]`` of ``[prompt | completion]`` (one body forward, no cache)."""
    body, _ = decoder_and_head(lm)
    completion_embeds = lm.get_input_embeddings()(completion_ids).to(prompt_embeds.dtype)  # [N, T, D]
    embeds = torch.cat([prompt_embeds, completion_embeds], dim=1)  # [N, L + T, D]
    attention = torch.cat([prompt_attention.long(), completion_mask.long()], dim=1)  # [N, L + T]
    return body(
        inputs_embeds=embeds, attention_mask=attention,
        position_ids=position_ids_from_attention(attention), use_cache=False,
    ).last_hidden_state


def _chunk_logprobs(head: nn.Module, hidden: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logit[c] - logsumexp(logits)``, ``logits = head(hidden).float() / temperature``; ``[N, t, D]`` → ``[N, t]``."""
    logits = head(hidden).float() / temperature  # [N, t, V]
    return logits.gather(-1, ids[..., None]).squeeze(-1) - logits.logsumexp(-1)  # [N, t]


def token_logprobs(head: nn.Module, hidden: torch.Tensor, completion_ids: torch.Tensor, *, temperature: float = 1.0,
                   max_logit_bytes: int | None = MAX_LOGIT_BYTES) -> torch.Tensor:
    """``log_softmax(head(hidden) / temperature)[completion_ids]`` per position, ``[N, T, D]``, ``[N, T]`` → ``[N, T]``.

    The T positions go through the head ``t = max(1, max_logit_bytes // (N·V·4))`` at a time, so at most one chunk of
    fp32 logits ``[N, t, V]`` exists (None: all T at once). Under autograd each chunk is checkpointed
    (``torch.utils.checkpoint``, non-reentrant): its forward keeps only the chunk's hidden states and the backward
    recomputes the chunk's logits, so the backward too holds one chunk at a time. Each position's arithmetic is the
    unchunked one; only the head matmul's row count differs between chunkings.
    """
    N, T = completion_ids.shape
    vocab = getattr(head, "out_features", None) or head.weight.shape[0]
    t = T if max_logit_bytes is None else max(1, int(max_logit_bytes) // max(1, N * vocab * 4))
    if t >= T:
        return _chunk_logprobs(head, hidden, completion_ids, temperature)
    parts = []
    for t0 in range(0, T, t):
        args = (head, hidden[:, t0:t0 + t], completion_ids[:, t0:t0 + t], temperature)
        if torch.is_grad_enabled():
            parts.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(*args))
    return torch.cat(parts, dim=1)  # [N, T]


def masked_token_logprobs(head: nn.Module, hidden: torch.Tensor, completion_ids: torch.Tensor,
                          completion_mask: torch.Tensor, *, temperature: float = 1.0,
                          max_logit_bytes: int | None = MAX_LOGIT_BYTES) -> torch.Tensor:
    """:func:`token_logprobs` over every position, then 0 where ``completion_mask`` is False; ``[N, T]``."""
    token_logp = token_logprobs(head, hidden, completion_ids, temperature=temperature, max_logit_bytes=max_logit_bytes)
    return token_logp.masked_fill(~completion_mask.bool(), 0.0)  # [N, T]


# How the LM head turns the states [N, T, D] into token_logp [N, T] (one signature; ``logprob_head`` picks one):
# reference = the head over all N·T positions, chunked by positions and checkpointed; fused = head_logprob.py (only
# the real tokens, vocabulary padded to 64 for the GEMMs, one autograd Function, frozen-head gradient in forward).
LOGPROB_HEADS = {"reference": masked_token_logprobs, "fused": fused_token_logprobs}


def logprob_head_function(logprob_head: str, where: str):
    """``LOGPROB_HEADS[logprob_head]``, or a ValueError naming the choices."""
    if logprob_head not in LOGPROB_HEADS:
        raise ValueError(f"{where}: logprob_head={logprob_head!r} is not one of {sorted(LOGPROB_HEADS)}; "
                         "'reference' is the default, 'fused' the fast path.")
    return LOGPROB_HEADS[logprob_head]


def completion_logprobs(
    lm: nn.Module,
    prompt_embeds: torch.Tensor,
    prompt_attention: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    return_hidden: bool = False,
    max_logit_bytes: int | None = MAX_LOGIT_BYTES,
    logprob_head: str = "reference",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced ``log π(c_t | prompt, c_<t)`` for every completion token, in one forward.

    With the sequence ``x = [prompt (L, left padded) | completion (T, right padded)]`` and final-
    norm hidden states ``h``: ``token_logp[:, t] = log_softmax(head(h[:, L-1+t]) / temperature)
    [completion_ids[:, t]]`` (position ``L-1+t`` predicts token t), computed as
    ``logit[c_t] - logsumexp(logits)``; 0 where ``completion_mask`` is False.
    ``hidden[:, t] = h[:, L+t]``, the state at the position whose *input* is ``c_t`` — Sa2VA's
    ``[SEG]`` embedding when ``c_t`` is ``[SEG]`` (its own log-prob comes from ``L-1+t``).

    Args:
        prompt_embeds: ``[N, L, D]``; prompt_attention: ``[N, L]`` LEFT padded.
        completion_ids: ``[N, T]`` long; completion_mask: ``[N, T]`` bool, True on a prefix.
        max_logit_bytes: bound on the fp32 logits of one head call; the head runs over T in chunks
            (:func:`token_logprobs`). None computes all ``[N, T, V]`` logits at once.
        logprob_head: a key of ``LOGPROB_HEADS``, how the head scores the tokens (same values up to float order).

    Returns:
        ``token_logp [N, T]`` float32 (differentiable), and ``hidden [N, T, D]`` if ``return_hidden``.
    """
    _check_completion(prompt_embeds, prompt_attention, completion_ids, completion_mask, "completion_logprobs")
    if temperature <= 0:
        raise ValueError(f"completion_logprobs: temperature must be > 0, got {temperature}.")
    score = logprob_head_function(logprob_head, "completion_logprobs")
    _, head = decoder_and_head(lm)
    L, T = prompt_embeds.shape[1], completion_ids.shape[1]
    h = _teacher_forced_hidden(lm, prompt_embeds, prompt_attention, completion_ids, completion_mask)  # [N, L + T, D]
    token_logp = score(head, h[:, L - 1:L + T - 1], completion_ids, completion_mask, temperature=temperature,
                       max_logit_bytes=max_logit_bytes)  # [N, T]
    if return_hidden:
        return token_logp, h[:, L:L + T]  # hidden [N, T, D]
    return token_logp


def completion_hidden(lm: nn.Module, prompt_embeds: torch.Tensor, prompt_attention: torch.Tensor,
                      completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """``hidden [N, T, D]`` of :func:`completion_logprobs` without the output head (no ``[N, T, V]`` logits):
    what the ``[SEG]`` passes need."""
    _check_completion(prompt_embeds, prompt_attention, completion_ids, completion_mask, "completion_hidden")
    L, T = prompt_embeds.shape[1], completion_ids.shape[1]
    return _teacher_forced_hidden(lm, prompt_embeds, prompt_attention, completion_ids, completion_mask)[:, L:L + T]
