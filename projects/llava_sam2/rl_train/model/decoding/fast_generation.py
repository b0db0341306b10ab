"""Fast rollout decoding: shared-prefix prefill, a static KV cache and a graph-replayable decode step.

Same contract as :func:`generation.sample_completions` (which stays the reference), plus the group size
``num_generations`` (G): the input is B prompts and the output N = B·G completions, row ``b·G + g`` the
g-th sample of prompt b (prompt-major, as :mod:`grpo.advantages` groups them).

How one call runs (docs/speed.md):

1. **Prefill once per prompt.** The B prompts go through the decoder body with a ``DynamicCache``, exactly
   as the reference prefills (with ``compile_step``: the scoring passes' compiled layer calls, :func:`prefill`); their
   keys/values are then copied G times into a static cache
   (transformers ``StaticLayer``s) of N rows and ``S = L + max_new_tokens`` slots (rounded up to :data:`CACHE_ALIGN`).
   The G samples of a prompt share its prefix, so prefill costs B rows, not N. Rows that begin with a common
   block (``prefix=SharedPrefix``: the image block of rows about one image) prefill each distinct block once
   and continue every row from it (:func:`prefill_shared`).
2. **One fixed-shape model step.** :func:`fast_decode_step.decode_logits` reads and writes only tensors
   allocated before the loop (:class:`fast_decode_step.DecodeState`: next input token, its position id
   and cache slot, an additive attention bias ``[N, 1, 1, S]``), so on CUDA it is captured once into a
   ``torch.cuda.CUDAGraph`` (after warm-up steps on a side stream) and replayed: one launch instead of
   ~40 per layer. On CPU the same function runs eagerly (what the tests exercise).
3. **Sampling on device, outside the graph.** ``p = softmax(top_p(logits / temperature))`` with
   transformers' ``TopPLogitsWarper`` (as the reference), then the exponential race
   ``argmax_i p_i / E_i``, ``E = empty_like(p).exponential_(generator)``. ``E_i / p_i ~ Exp(p_i)`` and the
   smallest of independent exponentials is index k with probability ``p_k / Σ p``, so the token has
   exactly the reference's distribution. It is also how ``torch.multinomial(p, 1)`` draws (torch 2.11,
   ``Distributions.cpp``), minus that function's ``.item()`` validity checks (two host syncs per step):
   with the same generator the fast path draws the reference's tokens (up to float-level differences in
   p). The sampler's ~15 kernels (a few, compiled, with ``compile_step``) are
   queued eagerly behind each replay (the GPU step takes milliseconds, the launches microseconds), which
   keeps sorting (top-p) and RNG out of the captured graph. ``generator`` must be on the prompts' device.
4. **Stops on device.** A row finishes on a token of ``stop_token_ids`` (a device-side flag); it keeps
   feeding ``pad_token_id``, masked out. The host reads ``all finished`` only every
   ``stop_check_interval`` steps; the output is trimmed to the longest row, as the reference does.

Invariants:

* A graph lives for one call. It reads parameters by address, so weight sets swapped by in-place copy
  (``grpo.weights``) are seen; Python-level switches (peft ``disable_adapter()``, train/eval) are frozen at
  capture, which happens inside the call, so ``with lm.disable_adapter(): fast_sample_completions(...)``
  decodes the reference policy.
* Decoding swaps the attention function for :func:`gqa_decode_attention` (a registered transformers
  attention implementation) on the LM config for the duration of the decode loop only, restored in
  ``finally``; the prefill uses the model's own implementation.
* Rotary embeddings come from a per-call table ``rotary_emb(positions 0..S-1)``, identical to the
  reference's per-step call for position-independent RoPE types; stateful ones (dynamic NTK, longrope)
  are accepted only while ``S`` stays below their original context length, where they do not rescale.

Works for transformers Qwen2 / Qwen3 / Llama / Phi3 ``*ForCausalLM`` (4.57 layer API), bare or peft-wrapped, and for
the Qwen2.5-VL / Qwen3-VL models given their prompts' M-RoPE positions (``prompt_positions``: the generated tokens'
equal-axis positions are 1-D RoPE from a per-row start, ``fast_decode_step.rope_table``). The default
backend (``'fast'``, :func:`fast_merged_completions`) decodes a peft LM on merged scratch copies of its LoRA-adapted
weights (``adapter_merge.merged_adapters``); ``'fast_adapters'`` keeps the adapters.
"""
from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn
from transformers import DynamicCache, TopPLogitsWarper
from transformers.cache_utils import Cache

from . import fast_decode_step, prefix_attention
from .adapter_merge import autocast_off_when_merged, merged_adapters
from .decode_plan import SplitPromptCache, build_step_plan
from .fast_decode_step import (CACHE_ALIGN, GQA_DECODE_ATTENTION, DecodeState, DecoderParts, GraphedCall,
                               TokenChooser, compiled_decode_logits, decode_logits,
                               rope_table)
from .generation import (Completions, SharedPrefix, _check_prompt, check_group_size, check_sampling_args,
                         continuation_positions, position_ids_from_attention, sample_completions)
from .grouped_scoring import branched_hidden, supports_grouping
from ..network.transformers_seams import cache_tensors, full_static_cache, select_cache_rows, using_attention


def _validate(*, num_generations, max_new_tokens, temperature, top_p, stop_token_ids, stop_check_interval,
              device: torch.device, generator, do_sample: bool, use_cuda_graph) -> None:
    check_group_size("fast_sample_completions", num_generations)
    check_sampling_args("fast_sample_completions", max_new_tokens=max_new_tokens, temperature=temperature,
                        top_p=top_p, stop_token_ids=stop_token_ids, stop_check_interval=stop_check_interval)
    if do_sample and generator is not None and generator.device.type != device.type:
        raise ValueError(
            f"fast_sample_completions: generator is on {generator.device} but the prompts are on {device}; "
            f"create it with torch.Generator(device={str(device)!r}) (the noise is drawn on device)."
        )
    if use_cuda_graph and device.type != "cuda":
        raise ValueError(f"fast_sample_completions: use_cuda_graph=True needs CUDA prompts, got {device}; "
                         "pass use_cuda_graph=None (auto) or False.")


def prefill(parts: DecoderParts, inputs_embeds: Tensor, attention_mask: Tensor, positions: Tensor | None = None,
            body_kwargs: dict | None = None, *, lm: nn.Module | None = None,
            layer_backend: str | None = None) -> tuple[Tensor, DynamicCache]:
    """Prefill of B prompts: final-norm hidden ``[B, D]`` at the last position, and the cache.
    ``positions``: the family's own (Qwen-VL's M-RoPE ``[3, B, L]``), else 1-D over the attention; ``body_kwargs``:
    extra keyword arguments of the decoder body (Qwen3-VL's deepstack features).

    ``layer_backend`` (with ``lm``, 1-D positions, an LM the grouped passes support): the decoder layers run as the
    scoring passes' prompt pass (``grouped_scoring.branched_hidden`` with no branch), each layer call compiled by that
    ``torch.compile`` backend: one graph for every layer, its norms, rotary and MLP products fused (the body's own
    forward runs ~15 elementwise passes per layer over the prompts). Same values up to float rounding. Otherwise the
    LM's own forward (the reference)."""
    cache = DynamicCache()
    if layer_backend is not None and lm is not None and positions is None and not body_kwargs \
            and supports_grouping(lm, inputs_embeds.shape[1]):
        hidden, _ = branched_hidden(lm, inputs_embeds, attention_mask, [], prefix_cache=cache,
                                    layer_backend=layer_backend)
        return hidden, cache
    attention = attention_mask.long()  # [B, L]
    hidden = parts.body(
        inputs_embeds=inputs_embeds, attention_mask=attention,
        position_ids=position_ids_from_attention(attention) if positions is None else positions,
        past_key_values=cache, use_cache=True, **(body_kwargs or {}),
    ).last_hidden_state[:, -1]  # [B, D]
    if cache.get_seq_length() != inputs_embeds.shape[1]:
        raise RuntimeError(
            "fast_sample_completions: the LM did not fill the KV cache (some LMs skip it under gradient "
            "checkpointing in train mode); call lm.eval() before sampling."
        )
    return hidden, cache


def prefill_shared(parts: DecoderParts, prefix: SharedPrefix, inputs_embeds: Tensor, attention_mask: Tensor, *,
                   lm: nn.Module | None = None,
                   layer_backend: str | None = None) -> tuple[Tensor, DynamicCache, Tensor]:
    """Prefill of n rows ``[prefix | own tokens]`` that runs each distinct prefix once.

    The U prefixes ``[U, P, D]`` fill a cache, whose rows are gathered to the n rows (``prefix.index``); the rows' own
    tokens ``[n, S, D]`` then run as a continuation of it (U·P + n·S tokens instead of n·(P + S)). Returns the
    last position's final-norm hidden ``[n, D]``, the cache of ``P + S`` slots and the joined attention ``[n, P + S]``.
    ``lm``, ``layer_backend``: the prefixes' pass as :func:`prefill`'s.
    """
    _, cache = prefill(parts, prefix.embeds, prefix.attention, lm=lm,
                       layer_backend=layer_backend)  # cache rows [U, Hkv, P, hd]
    select_cache_rows(cache, prefix.index)  # -> [n, Hkv, P, hd]
    P = prefix.attention.shape[1]
    attention = torch.cat([prefix.attention[prefix.index].long(), attention_mask.long()], dim=1)  # [n, P + S]
    positions = position_ids_from_attention(attention)[:, P:]  # [n, S]
    hidden = parts.body(inputs_embeds=inputs_embeds, attention_mask=attention, position_ids=positions,
                        past_key_values=cache, use_cache=True).last_hidden_state[:, -1]  # [n, D]
    if cache.get_seq_length() != attention.shape[1]:
        raise RuntimeError("fast_sample_completions: the LM did not extend the prefix cache; call lm.eval() first.")
    return hidden, cache, attention


def replicate_prefix(prefix: DynamicCache, num_generations: int, num_slots: int) -> Cache:
    """A static cache of ``N = B·G`` rows and ``num_slots`` slots whose first L slots hold the prefix
    keys/values, row ``b·G + g`` ← prompt b (the G samples of a prompt share its prefill)."""
    layers = cache_tensors(prefix)
    B, Hkv, L, hd = layers[0][0].shape
    G = num_generations
    cache = full_static_cache(len(layers), B * G, num_slots, like=layers[0][0])
    for (key, value), (slot_key, slot_value) in zip(layers, cache_tensors(cache)):
        # slot views [N, Hkv, L, hd] seen as [B, G, Hkv, L, hd]; the prompt's [B, 1, Hkv, L, hd] broadcasts over G
        slot_key[:, :, :L].view(B, G, Hkv, L, hd).copy_(key[:, None])
        slot_value[:, :, :L].view(B, G, Hkv, L, hd).copy_(value[:, None])
    return cache


def grouped_prefix_rows(prefix: SharedPrefix | None) -> int | None:
    """k when the rows' prefixes are ``0 (k times), 1 (k times), ...`` (rows about one image next to each other, as
    the pipelines build them), else None."""
    if prefix is None:
        return None
    index, U = prefix.index, prefix.attention.shape[0]
    if len(index) % U:
        return None
    k = len(index) // U
    return k if torch.equal(index, torch.arange(U, device=index.device).repeat_interleave(k)) else None


def split_cache(prompt_cache: DynamicCache, prefix: SharedPrefix | None, rows: int, num_slots: int, *,
                kernel: bool) -> SplitPromptCache:
    """The split cache of a decode call. With a shared prefix whose rows come in groups
    (:func:`grouped_prefix_rows`), its U prefixes stay the shared part (read once per step for all their rows) and each
    row's own prompt tokens go to its tail; otherwise every prompt row is shared only by its G samples."""
    layers = cache_tensors(prompt_cache)  # [n, Hkv, L, hd]
    if grouped_prefix_rows(prefix) is None:
        return SplitPromptCache.of(layers, rows, num_slots, kernel=kernel)
    U, P = prefix.attention.shape
    firsts = torch.arange(U, device=prefix.index.device) * (len(prefix.index) // U)  # a row of each prefix
    return SplitPromptCache.of([(k[firsts, :, :P], v[firsts, :, :P]) for k, v in layers], rows, num_slots,
                               kernel=kernel, own_layers=[(k[:, :, P:], v[:, :, P:]) for k, v in layers])


def init_state(attention_mask: Tensor, num_generations: int, max_new_tokens: int, num_slots: int, *,
               dtype: torch.dtype, vocab_size: int, pad_token_id: int, rope: tuple[Tensor, Tensor],
               return_step_probs: bool, hidden_size: int | None = None, rope_axes: int = 0,
               first_position: Tensor | None = None, hidden_after_norm: bool = True) -> DecodeState:
    """The decode state right after prefill: prompt slots visible, the first new token at slot L, at position
    ``first_position [B]`` (default: the prompt's real-token count)."""
    B, L = attention_mask.shape
    N, T, device = B * num_generations, max_new_tokens, attention_mask.device
    prompt_attention = attention_mask.bool().repeat_interleave(num_generations, 0)  # [N, L]
    attention_bias = torch.full((N, 1, 1, num_slots), torch.finfo(dtype).min, dtype=dtype, device=device)
    attention_bias[:, 0, 0, :L].masked_fill_(prompt_attention, 0.0)
    if first_position is None:
        first_position = position_ids_from_attention(attention_mask.long())[:, -1] + 1  # [B]
    return DecodeState(
        token=torch.full((N,), pad_token_id, dtype=torch.long, device=device),
        position=first_position.repeat_interleave(num_generations),  # [N]
        cache_position=torch.full((1,), L, dtype=torch.long, device=device),
        column=torch.zeros(1, dtype=torch.long, device=device),
        attention_bias=attention_bias,
        is_finished=torch.zeros(N, dtype=torch.bool, device=device),
        ids=torch.full((N, T), pad_token_id, dtype=torch.long, device=device),
        token_logp=torch.zeros(N, T, dtype=torch.float32, device=device),
        is_active=torch.zeros(N, T, dtype=torch.bool, device=device),
        step_probs=torch.zeros(N, T, vocab_size, device=device) if return_step_probs else None,
        cos=rope[0], sin=rope[1],
        hidden=None if hidden_size is None else torch.zeros(N, T, hidden_size, dtype=dtype, device=device),
        rope_axes=rope_axes, hidden_after_norm=hidden_after_norm,
    )


@torch.no_grad()
def fast_sample_completions(
    lm: nn.Module,
    inputs_embeds: Tensor,
    attention_mask: Tensor,
    *,
    num_generations: int = 1,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    do_sample: bool = True,
    stop_token_ids: list[int] | tuple[int, ...],
    pad_token_id: int = 0,
    generator: torch.Generator | None = None,
    stop_check_interval: int = 8,
    use_cuda_graph: bool | None = None,
    compile_step: bool = False,
    return_step_probs: bool = False,
    return_hidden: bool = False,
    prefix: SharedPrefix | None = None,
    fuse_layers: bool = False,
    pad_head: bool = False,
    decode_attention: str = "grouped",
    split_prompt_cache: bool = False,
    prompt_positions: Tensor | None = None,
    prefill_kwargs: dict | None = None,
    hidden_after_norm: bool = True,
) -> Completions | tuple[Completions, Tensor]:
    """Decode G completions for each of B prompts: :func:`generation.sample_completions` semantics, fast.

    Step t: ``logits_t = head(body(c_{t-1} | cache)) / temperature``; the token is the argmax
    (``do_sample=False``) or a draw from ``softmax(top_p(logits_t))`` (module docstring, item 3).

    Args:
        lm: a transformers Qwen2/Qwen3/Llama/Phi3 causal LM, or a Qwen-VL model with ``prompt_positions``, possibly
            peft-wrapped (``lm.eval()`` for rollouts).
        inputs_embeds: ``[B, L, D]`` prompt embeddings; attention_mask: ``[B, L]``, LEFT padded.
        num_generations: G, samples per prompt; rows are prompt-major (``b·G + g``).
        generator: RNG on the prompts' device for the sampling noise.
        use_cuda_graph: capture the decode step in a CUDA graph; None = on CUDA only.
        compile_step: run the step through ``torch.compile`` (``fast_decode_step.compiled_decode_logits``) before
            the graph capture: fewer, fused kernels per step; compiles on the process's first call, with symbolic
            sizes that later calls of other shapes reuse. Also compiles the token choice (top-p off) and runs the
            prefill's layers compiled (:func:`prefill`).
        return_step_probs: also return the sampling distribution of every step ``[N, T, V]`` float32
            (``softmax(top_p(logits / temperature))``; debug/tests, it costs N·T·V floats).
        return_hidden: keep each fed-back token's final-norm state (``Completions.hidden``, N·T·D values).
        prefix: the prompts are ``[prefix | inputs_embeds]`` (``generation.SharedPrefix``); each distinct prefix is
            prefilled once (:func:`prefill_shared`).
        fuse_layers: run Qwen2/Llama decoder layers on joined q|k|v and gate|up scratch weights with fused RMSNorms
            (``decode_plan.FusedLayer``): fewer kernels per step, same results up to float rounding.
        pad_head: compute the LM head on a copy padded to a multiple of 64 rows (aligned logit rows for cuBLAS);
            the padded columns are sliced off before sampling: the same tokens and ``token_logp``.
        decode_attention: the one-query attention of the step: ``grouped`` (``gqa_decode_attention``),
            ``sdpa_gqa`` (SDPA ``enable_gqa``) or ``flex`` (``flex_attention``; fast only with ``compile_step``).
        split_prompt_cache: keep the B prompts' keys/values once and the N rows' new ones apart
            (``decode_plan.SplitPromptCache``): each step reads a prompt's cache once for its G rows, not G times;
            with a ``prefix`` whose rows come in groups (:func:`grouped_prefix_rows`) each prefix once for all its
            rows. On CUDA the attention runs ``prefix_attention``'s Triton kernels. Needs ``fuse_layers`` on an LM
            whose every decoder layer fuses (it replaces ``decode_attention``).
        prompt_positions: the prompts' own positions, Qwen-VL's M-RoPE ``[3, B, L]`` (``lm`` a Qwen-VL model): the
            prefill takes them; each generated token goes on from its row's largest + 1, equal on the three axes
            (``generation.continuation_positions``), which is 1-D RoPE from a per-row offset. Not with ``prefix``.
        prefill_kwargs: extra keyword arguments of the decoder body at the prefill (Qwen3-VL's deepstack features).
        hidden_after_norm: ``return_hidden`` keeps the final-norm states (True) or the last layer's outputs before
            the final norm (Qwen3-VL's ``[SEG]`` states).

    Returns:
        :class:`Completions` with N = B·G rows (and ``step_probs`` if asked), trimmed to the longest row.
    """
    device = inputs_embeds.device
    _validate(num_generations=num_generations, max_new_tokens=max_new_tokens, temperature=temperature,
              top_p=top_p, stop_token_ids=stop_token_ids, stop_check_interval=stop_check_interval,
              device=device, generator=generator, do_sample=do_sample, use_cuda_graph=use_cuda_graph)
    _check_prompt(inputs_embeds, attention_mask, "prompt")
    # made before the prefill is queued: a host list copied to the device blocks the host until the stream drains,
    # and past this point the host must stay ahead of the prefill to record the step's graph meanwhile
    stop_ids = torch.as_tensor(list(stop_token_ids), device=device)
    parts = DecoderParts.of(lm)
    if prompt_positions is not None and prefix is not None:
        raise ValueError("fast_sample_completions: prompt_positions (a family's own positions) cannot be joined to a "
                         "shared prefix; pass whole prompts (prefix=None).")
    first_position = None if prompt_positions is None else \
        continuation_positions(prompt_positions, 1)[0, :, 0]  # [B], the same on every M-RoPE axis
    prefill_layers = dict(lm=lm, layer_backend=fast_decode_step.COMPILE_BACKEND if compile_step else None)
    if prefix is None:
        hidden, prompt_cache = prefill(parts, inputs_embeds, attention_mask, prompt_positions,
                                       prefill_kwargs, **prefill_layers)  # [B, D]
    else:
        _check_prompt(prefix.embeds, prefix.attention, "shared prefix")
        hidden, prompt_cache, attention_mask = prefill_shared(parts, prefix, inputs_embeds, attention_mask,
                                                                 **prefill_layers)
    L, G, T = attention_mask.shape[1], num_generations, max_new_tokens
    num_slots = -(-(L + T) // CACHE_ALIGN) * CACHE_ALIGN
    table_length = num_slots if first_position is None else max(num_slots, int(first_position.max()) + T)
    *rope, rope_axes = rope_table(parts.rotary, table_length, inputs_embeds[:1, :1],
                                  multimodal=prompt_positions is not None)
    plan = build_step_plan(parts.layers, parts.head, default_attention=GQA_DECODE_ATTENTION,
                           attention=decode_attention, fuse_layers=fuse_layers, pad_head=pad_head)
    first_logits = plan.logits(parts.head, hidden).float() / temperature  # [B, V]
    if split_prompt_cache:
        if plan.layers is None or any(layer is None for layer in plan.layers):
            raise ValueError("fast_sample_completions: split_prompt_cache=True needs fuse_layers=True and an LM whose "
                             "every decoder layer fuses (Qwen2/Llama layers on plain or merged linears).")
        cache = split_cache(prompt_cache, prefix, hidden.shape[0] * G, num_slots,
                            kernel=device.type == "cuda" or prefix_attention.interpreted())
    else:
        cache = replicate_prefix(prompt_cache, G, num_slots)
    del prompt_cache
    state = init_state(attention_mask, G, T, num_slots, dtype=inputs_embeds.dtype,
                       vocab_size=first_logits.shape[-1], pad_token_id=pad_token_id, rope=rope,
                       return_step_probs=return_step_probs,
                       hidden_size=hidden.shape[-1] if return_hidden else None, rope_axes=rope_axes,
                       first_position=first_position, hidden_after_norm=hidden_after_norm)
    choose = TokenChooser(
        do_sample=do_sample, top_p=TopPLogitsWarper(top_p) if top_p < 1.0 else None,
        stop_ids=stop_ids, pad_token_id=pad_token_id,
        generator=generator, compiled=compile_step,
    )
    choose(first_logits.repeat_interleave(G, 0), state)  # column 0 from the shared prefill, [N, V]

    step = compiled_decode_logits(fast_decode_step.COMPILE_BACKEND) if compile_step else decode_logits
    forward = partial(step, parts, cache, state, temperature, plan)
    use_graph = device.type == "cuda" if use_cuda_graph is None else use_cuda_graph
    next_logits = GraphedCall(forward, device) if use_graph else forward
    with using_attention(parts.body.config, plan.attention):
        for t in range(1, T):
            if t % stop_check_interval == 0 and bool(state.is_finished.all()):  # host sync every k steps
                break
            choose(next_logits(), state)  # column t
    return _completions(state, return_step_probs)


def _completions(state: DecodeState, return_step_probs: bool) -> Completions | tuple[Completions, Tensor]:
    """Trim the output buffers to the longest row (rows are prefix-masked)."""
    T = int(state.is_active.sum(-1).max())
    out = Completions(ids=state.ids[:, :T], completion_mask=state.is_active[:, :T],
                      is_truncated=~state.is_finished, token_logp=state.token_logp[:, :T],
                      hidden=None if state.hidden is None else state.hidden[:, :T])
    return (out, state.step_probs[:, :T]) if return_step_probs else out


def fast_merged_completions(lm: nn.Module, inputs_embeds: Tensor, attention_mask: Tensor, **kwargs) -> Completions:
    """:func:`fast_sample_completions` with every LoRA-adapted linear of ``lm`` on a merged scratch weight
    ``W + s·BA`` (``adapter_merge.merged_adapters``): one GEMM per linear instead of five kernels, the live weights
    untouched. Same completions up to float rounding; costs one scratch copy of the adapted weights per call. Under a
    rollout's AMP autocast the call runs with autocast off once every adapter is merged (nothing left in fp32)."""
    with merged_adapters(lm), autocast_off_when_merged(lm):
        return fast_sample_completions(lm, inputs_embeds, attention_mask, **kwargs)


def reference_completions(lm: nn.Module, inputs_embeds: Tensor, attention_mask: Tensor, *, num_generations: int = 1,
                          prefix: SharedPrefix | None = None, **kwargs) -> Completions:
    """:func:`generation.sample_completions` with the fast path's input layout: the B prompts (joined to their
    ``prefix``) are repeated into N = B·G rows (``b·G + g``) and decoded row by row, prefill included (the reference
    the fast path is tested against, and the switch back to it)."""
    check_group_size("reference_completions", num_generations)  # the other arguments: sample_completions checks
    if prefix is not None:
        inputs_embeds, attention_mask = prefix.full_prompts(inputs_embeds, attention_mask)  # [B, P + S, ...]
    rows = inputs_embeds.repeat_interleave(num_generations, 0), attention_mask.repeat_interleave(num_generations, 0)
    return sample_completions(lm, *rows, **kwargs)  # [N, L, D], [N, L]


# decode_backend name -> decoder with the signature of fast_sample_completions' common arguments
# (lm, embeds [B, L, D], attention [B, L], *, num_generations, max_new_tokens, temperature, top_p, do_sample,
# stop_token_ids, pad_token_id, generator, return_hidden, prefix) -> Completions of N = B·G rows (a decoder may leave
# Completions.hidden None; callers then recompute the states with generation.completion_hidden; a decoder without
# prefix sharing decodes prefix.full_prompts(embeds, attention)).
DECODE_BACKENDS = {
    "fast": fast_merged_completions,  # LoRA merged into scratch weights for the call
    "fast_compiled": partial(fast_merged_completions, compile_step=True),  # opt-in until measured on GPU
    # + decode_plan's fused layers and padded head (opt-in until measured on GPU; docs/speed.md "Decode-step variants")
    "fast_fused": partial(fast_merged_completions, fuse_layers=True, pad_head=True),
    "fast_fused_sdpa": partial(fast_merged_completions, fuse_layers=True, pad_head=True, decode_attention="sdpa_gqa"),
    "fast_fused_sdpa_compiled": partial(fast_merged_completions, fuse_layers=True, pad_head=True,
                                        decode_attention="sdpa_gqa", compile_step=True),
    "fast_fused_compiled": partial(fast_merged_completions, fuse_layers=True, pad_head=True, compile_step=True),
    # + the prompt's cache read once for its G rows (decode_plan.SplitPromptCache, prefix_attention's kernels on CUDA)
    "fast_fused_split": partial(fast_merged_completions, fuse_layers=True, pad_head=True, split_prompt_cache=True),
    "fast_fused_split_compiled": partial(fast_merged_completions, fuse_layers=True, pad_head=True,
                                         split_prompt_cache=True, compile_step=True),
    "fast_adapters": fast_sample_completions,  # LoRA kept as adapters: no scratch memory, ~2x the step's kernels
    "reference": reference_completions,
}


def decode_completions(lm: nn.Module, inputs_embeds: Tensor, attention_mask: Tensor, *, decode_backend: str = "fast",
                       **kwargs) -> Completions:
    """Decode with the backend named ``decode_backend`` (a key of :data:`DECODE_BACKENDS`); ``kwargs`` as
    :func:`fast_sample_completions` minus its fast-only knobs."""
    if decode_backend not in DECODE_BACKENDS:
        raise ValueError(f"decode_completions: decode_backend={decode_backend!r} is not one of "
                         f"{sorted(DECODE_BACKENDS)}; use 'fast' (default) or 'reference' (the plain decode loop, "
                         "for LMs the fast path does not support).")
    return DECODE_BACKENDS[decode_backend](lm, inputs_embeds, attention_mask, **kwargs)
