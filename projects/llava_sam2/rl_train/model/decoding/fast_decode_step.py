"""The fixed-shape decode step of :mod:`fast_generation`, and what it needs.

One step is ``choose(decode_logits())``. :func:`decode_logits` runs the LM for one token per row reading
and writing only preallocated tensors (:class:`DecodeState`), so :class:`GraphedCall` captures it once
into a CUDA graph and replays it. :class:`TokenChooser` then picks the tokens on device (greedy, or
top-p sampling with ``torch.multinomial``'s exponential race minus its host-side checks) and applies
the stop rule; its launches (~15 eager, a few when compiled) are queued behind the graph without any host
synchronisation.
:func:`gqa_decode_attention` is the registered attention implementation the step runs with.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import TopPLogitsWarper
from transformers.cache_utils import Cache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .decode_plan import SplitPromptCache, StepPlan
from .generation import decoder_and_head
from ..network.torch_seams import mark_sizes_symbolic
from ..network.transformers_seams import cache_tensors, run_decoder_layer

GQA_DECODE_ATTENTION = "sa2va_gqa_decode"
CACHE_ALIGN = 64  # static cache slots are rounded up to this (aligned attention-bias rows; masked anyway)
GRAPH_WARMUP_STEPS = 1  # eager steps on a side stream before capture (lazy cuBLAS/SDPA initialisation)
COMPILE_BACKEND = "inductor"  # torch.compile backend of compiled_decode_logits (tests use "aot_eager": no codegen)
_STATEFUL_ROPE = ("dynamic", "longrope")


def gqa_decode_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                         attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         **kwargs) -> tuple[Tensor, None]:
    """One-query attention over a static cache without copying KV heads.

    ``out[n, h] = softmax(q[n, h] k[n, h // r]ᵀ · scaling + bias[n]) v[n, h // r]`` with ``r = H / Hkv``:
    the head pairing of transformers' ``repeat_kv``, computed by reading the r query heads that share one
    KV head as r queries of that head (``repeat_kv`` would copy the whole cache r times per layer and step).

    Args:
        query: ``[N, H, 1, hd]``; key, value: ``[N, Hkv, S, hd]``; attention_mask: additive ``[N, 1, 1, S]``.

    Returns:
        ``(out [N, 1, H, hd], None)``, the layout of transformers' ``sdpa_attention_forward``.
    """
    N, H, q_len, hd = query.shape
    if q_len != 1:  # a multi-token call (not made by decode_logits) keeps transformers' path
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    Hkv = key.shape[1]
    grouped = query.reshape(N, Hkv, H // Hkv, hd)  # [N, Hkv, r, hd]
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling)  # [N, Hkv, r, hd]
    return out.reshape(N, 1, H, hd), None


ALL_ATTENTION_FUNCTIONS[GQA_DECODE_ATTENTION] = gqa_decode_attention


@dataclass(frozen=True)
class DecoderParts:
    """The pieces of a transformers causal LM that the decode step calls directly."""

    body: nn.Module  # decoder body (prefill)
    embed: nn.Module  # input embeddings
    layers: nn.ModuleList  # decoder layers (decode step)
    norm: nn.Module  # final norm
    head: nn.Module  # output head
    rotary: nn.Module  # rotary embedding module

    @classmethod
    def of(cls, lm: nn.Module) -> DecoderParts:
        body, head = decoder_and_head(lm)
        missing = [name for name in ("layers", "norm", "rotary_emb") if not hasattr(body, name)]
        if missing:
            raise TypeError(
                f"fast_generation: the decoder body {type(body).__name__} has no {missing}; the fast path "
                "needs a transformers Qwen2/Qwen3/Llama/Phi3-style body (layers, norm, rotary_emb). Use "
                "generation.sample_completions for other LMs (decode_backend='reference' in GRPOConfig / "
                "TextDecoding)."
            )
        return cls(body, lm.get_input_embeddings(), body.layers, body.norm, head, body.rotary_emb)


def rope_table(rotary: nn.Module, length: int, like: Tensor, *, multimodal: bool = False) -> tuple[Tensor, Tensor, int]:
    """``(cos, sin, axes)``: ``cos, sin [S, hd]`` for positions ``0..S-1`` in ``like``'s dtype/device, from the LM's
    own module, and how many leading M-RoPE axes the LM's layers take them with (0: none).

    ``multimodal``: a Qwen-VL text rotary, asked for positions equal on its three M-RoPE axes (what every generated
    text token has). Each axis then gives the same 1-D table, so whichever frequency chunks an axis owns (Qwen2.5-VL's
    ``mrope_section`` blocks, Qwen3-VL's interleaving) the result is plain RoPE at that position. Qwen2.5-VL's module
    returns the three axes ``[3, 1, S, hd]`` (its layers select the chunks: ``axes = 3``), Qwen3-VL's has already
    merged them ``[1, S, hd]`` (``axes = 0``)."""
    rope_type = getattr(rotary, "rope_type", "default")
    limit = getattr(rotary, "original_max_seq_len", None)  # dynamic NTK rescales past this
    if rope_type == "longrope":  # longrope switches to its long factors past the pre-training length
        limit = getattr(getattr(rotary, "config", None), "original_max_position_embeddings", None) or limit
    if any(kind in rope_type for kind in _STATEFUL_ROPE) and limit is not None and length >= limit:
        raise NotImplementedError(
            f"fast_generation: RoPE type {rope_type!r} rescales past {limit} positions, and prompt + "
            f"max_new_tokens needs {length}; the per-call rotary table would differ from the reference's "
            "per-step update. Shorten the prompt/max_new_tokens or use generation.sample_completions."
        )
    positions = torch.arange(length, device=like.device)[None]  # [1, S]
    if multimodal:
        positions = positions[None].expand(3, -1, -1)  # [3, 1, S]: equal on every axis
    cos, sin = rotary(like, positions)  # [1, S, hd] or [3, 1, S, hd]
    axes = cos.shape[0] if cos.dim() == 4 else 0
    if axes:
        cos, sin = cos[0], sin[0]  # the axes are equal
    return cos[0], sin[0], axes


@dataclass
class DecodeState:
    """Every tensor one decode step reads or writes, allocated once per call (fixed addresses for a graph).

    Attributes:
        token: ``[N]`` long, the input of the next step (the last chosen token).
        position: ``[N]`` long, its position id (a Qwen-VL row's: the same on its three M-RoPE axes).
        cache_position: ``[1]`` long, its slot in the static cache.
        column: ``[1]`` long, the output column the next choice fills.
        attention_bias: ``[N, 1, 1, S]`` additive, 0 on visible slots and the dtype minimum elsewhere.
        is_finished: ``[N]`` bool, True once a row emitted a stop token.
        ids: ``[N, T]`` long; token_logp: ``[N, T]`` float32; is_active: ``[N, T]`` bool (the outputs).
        step_probs: ``[N, T, V]`` float32 sampling distributions (debug), or None.
        cos, sin: ``[S, hd]`` rotary tables.
        hidden: ``[N, T, D]`` state of each fed-back token (``Completions.hidden``), or None.
        rope_axes: leading M-RoPE axes the layers take the rotary tables with (0: none; Qwen2.5-VL: 3).
        hidden_after_norm: ``hidden`` holds the final-norm state (True) or the last layer's output before it.
    """

    token: Tensor
    position: Tensor
    cache_position: Tensor
    column: Tensor
    attention_bias: Tensor
    is_finished: Tensor
    ids: Tensor
    token_logp: Tensor
    is_active: Tensor
    step_probs: Tensor | None
    cos: Tensor
    sin: Tensor
    hidden: Tensor | None = None
    rope_axes: int = 0
    hidden_after_norm: bool = True


def record_choice(logits: Tensor, noise: Tensor | None, state: DecodeState, stop_ids: Tensor, pad_token_id: int,
                  top_p: TopPLogitsWarper | None = None) -> None:
    """Fill output column ``state.column`` from ``logits [N, V]`` (float32, / temperature) and apply the stop rule.

    Greedy (``noise`` None): ``argmax logits``. Sampling: ``argmax_i p_i / E_i`` with ``p = softmax(top_p(logits))``
    and ``noise`` the draws ``E ~ Exp(1)`` ``[N, V]``."""
    probs = None
    if noise is not None or state.step_probs is not None:
        probs = (top_p(None, logits) if top_p is not None else logits).softmax(-1)  # [N, V]
    if noise is not None:
        # E = 0 would make 0/0 = NaN on a filtered token, and argmax picks NaN: keep E > 0
        token = (probs / noise.clamp_min(torch.finfo(noise.dtype).tiny)).argmax(-1)  # [N]
    else:
        token = logits.argmax(-1)  # [N]
    is_active = ~state.is_finished
    token = token.masked_fill(~is_active, pad_token_id)
    token_logp = logits.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)  # [N]
    state.ids.index_copy_(1, state.column, token[:, None])
    state.token_logp.index_copy_(1, state.column, token_logp.masked_fill(~is_active, 0.0)[:, None])
    state.is_active.index_copy_(1, state.column, is_active[:, None])
    if state.step_probs is not None:
        state.step_probs.index_copy_(1, state.column, probs[:, None])
    state.is_finished |= is_active & (token[:, None] == stop_ids).any(-1)
    state.token.copy_(token)
    state.column += 1


@functools.cache
def compiled_record_choice(backend: str) -> Callable[..., None]:
    """:func:`record_choice` through ``torch.compile`` (top-p off, no step distributions kept), built once per process
    and backend. Eager, the choice is ~15 kernels that each pass over the ``[N, V]`` float32 logits (4b preset, N = 64:
    0.33 ms of a 4.8 ms step on an H100); compiled, the softmax, the race, the argmax and the chosen log-prob share
    a few reductions. The rows N and columns T are symbolic from the first trace on, so calls of other shapes reuse
    it. Float results agree with the eager choice to rounding (a near-tie may flip, as under the compiled step)."""
    compiled = torch.compile(record_choice, backend=backend)

    def choose(logits: Tensor, noise: Tensor | None, state: DecodeState, stop_ids: Tensor, pad_token_id: int) -> None:
        for tensor, dims in ((logits, (0,)), (noise, (0,)), (state.ids, (0, 1)), (state.token_logp, (0, 1)),
                             (state.is_active, (0, 1)), (state.is_finished, (0,)), (state.token, (0,))):
            if tensor is not None:
                mark_sizes_symbolic(tensor, dims)
        compiled(logits, noise, state, stop_ids, pad_token_id)

    return choose


@dataclass(frozen=True)
class TokenChooser:
    """Pick one token per row from temperature-scaled logits, on device, and apply the stop rule
    (:func:`record_choice`; ``compiled``: :func:`compiled_record_choice` where it applies).

    Greedy: ``argmax logits``. Sampling: ``argmax_i p_i / E_i`` with ``p = softmax(top_p(logits))`` and
    ``E ~ Exp(1)`` drawn from ``generator`` (``torch.multinomial``'s draw, without its host-side checks).
    """

    do_sample: bool
    top_p: TopPLogitsWarper | None  # None when top_p == 1
    stop_ids: Tensor  # [K] long
    pad_token_id: int
    generator: torch.Generator | None
    compiled: bool = False

    def __call__(self, logits: Tensor, state: DecodeState) -> None:
        """Fill output column ``state.column`` from logits ``[N, V]`` (float32, / temperature); device only."""
        # drawn here, outside any compiled code: the generator's stream stays torch's own (the reference's draws)
        noise = torch.empty_like(logits).exponential_(generator=self.generator) if self.do_sample else None  # [N, V]
        if self.compiled and self.top_p is None and state.step_probs is None:
            compiled_record_choice(COMPILE_BACKEND)(logits, noise, state, self.stop_ids, self.pad_token_id)
        else:
            record_choice(logits, noise, state, self.stop_ids, self.pad_token_id, self.top_p)


def decode_logits(parts: DecoderParts, cache: Cache, state: DecodeState, temperature: float,
                  plan: StepPlan | None = None) -> Tensor:
    """Feed ``state.token`` at ``state.cache_position`` and return the next logits ``[N, V]`` (float32,
    divided by temperature); advances the position and cache slot. Fixed shapes, no host synchronisation:
    the function a CUDA graph captures. Runs with the attention set on the LM's config (by default
    :func:`gqa_decode_attention`); ``plan`` (``decode_plan.StepPlan``) adds fused layers and a padded head."""
    hidden = parts.embed(state.token)[:, None].to(state.attention_bias.dtype)  # [N, 1, D]
    state.attention_bias.index_fill_(3, state.cache_position, 0.0)  # the input's own slot becomes visible
    rope = (F.embedding(state.position, state.cos)[:, None], F.embedding(state.position, state.sin)[:, None])
    if state.rope_axes:  # [axes, N, 1, hd]: the same table on every M-RoPE axis
        rope = tuple(r[None].expand(state.rope_axes, *r.shape) for r in rope)
    position_ids = state.position[:, None]  # [N, 1]
    fused = plan.layers if plan is not None and plan.layers is not None else (None,) * len(parts.layers)
    for layer, fused_layer in zip(parts.layers, fused):
        if fused_layer is not None:
            hidden = fused_layer.step(hidden, cache, state.attention_bias, rope, state.cache_position, plan.attention)
            continue
        hidden = run_decoder_layer(layer, hidden, cache, attention_mask=state.attention_bias,
                                   position_ids=position_ids, use_cache=True, cache_position=state.cache_position,
                                   position_embeddings=rope)  # [N, 1, D]
    # [N, D], the state of input state.token = column - 1's token
    normed = (plan.norm(parts.norm, hidden) if plan is not None else parts.norm(hidden))[:, -1]
    if state.hidden is not None:
        kept = normed if state.hidden_after_norm else hidden[:, -1]
        state.hidden.index_copy_(1, state.column - 1, kept[:, None].to(state.hidden.dtype))
    head_out = plan.logits(parts.head, normed) if plan is not None else parts.head(normed)
    logits = head_out.float() / temperature  # [N, V] (contiguous: a padded head's [N, Vp] is sliced before this)
    state.position += 1
    state.cache_position += 1
    return logits


def mark_step_sizes_symbolic(cache: Cache | SplitPromptCache, state: DecodeState) -> None:
    """Mark the sizes that differ from one decode call to the next as symbolic for ``torch.compile``: the cache slots
    S, the output columns T, the rotary table's length, and the rows N (on a :class:`SplitPromptCache`: its prompt
    length L and its tail's S - L slots, the rows staying constants). Everything else the step reads (weights, head
    counts, head size, vocabulary) stays a constant of the graph.

    The split cache keeps its rows constant because its step regroups the N rows as B prompts of N // B: traced with
    both symbolic, each layer's regrouping costs seconds of shape reasoning (tiny CPU LM: ~6 s per layer against ~1 s
    with constant rows). A call with a new B, and one with a new N, then compiles once more each (torch keeps a size
    that changed symbolic from then on, paying that slower trace once)."""
    split = isinstance(cache, SplitPromptCache)
    rows = () if split else (0,)
    marks = [(state.attention_bias, (*rows, 3)), (state.token, rows), (state.position, rows), (state.cos, (0,)),
             (state.sin, (0,))]
    if state.hidden is not None:
        marks.append((state.hidden, (*rows, 1)))
    layers = [*cache.prefix, *cache.tail] if split else cache_tensors(cache)
    marks += [(tensor, (*rows, 2)) for pair in layers for tensor in pair]  # [rows, Hkv, slots, hd]
    for tensor, dims in marks:
        if dims:
            mark_sizes_symbolic(tensor, dims)


@functools.cache
def compiled_decode_logits(backend: str) -> Callable[..., Tensor]:
    """:func:`decode_logits` through ``torch.compile(backend=backend)``, built once per process and backend; the
    returned function takes :func:`decode_logits`' arguments.

    Inductor fuses the step's ~40 small kernels per layer (norms, rotary, residuals, casts) into fewer ones; the
    compiled step is still captured into a CUDA graph by :class:`GraphedCall`. The sizes that vary between calls are
    symbolic from the first trace on (:func:`mark_step_sizes_symbolic`; each its own symbol, even where two are equal),
    so the first call compiles (tens of seconds for a 3B LM) and later calls of other N, S, T or prompt lengths reuse
    that graph. What still compiles again: a new temperature (a constant of the graph), a call of a single row (N = 1;
    torch specialises sizes 0 and 1) and, with the split cache, the first new prompt count B and the first new row
    count N (:func:`mark_step_sizes_symbolic`). The in-place state and cache updates are kept (functionalised and
    written back).
    """
    compiled = torch.compile(decode_logits, backend=backend)

    def step(parts: DecoderParts, cache: Cache | SplitPromptCache, state: DecodeState, temperature: float,
             plan: StepPlan | None = None) -> Tensor:
        mark_step_sizes_symbolic(cache, state)  # marks on the tensors: read only when a trace is made
        return compiled(parts, cache, state, temperature, plan)

    return step


class _DeviceGraphs:
    """Per device: the side stream of warm-up and capture, and the last graph captured, whose memory pool the next
    capture shares. Holding the last graph keeps that pool (device and pinned-host parts) alive between decode calls,
    so each call's graph reuses the blocks of the one before instead of taking new memory."""

    def __init__(self):
        self.stream = torch.cuda.Stream()
        self.last: torch.cuda.CUDAGraph | None = None


@functools.cache
def _device_graphs(device_index: int) -> _DeviceGraphs:
    with torch.cuda.device(device_index):
        return _DeviceGraphs()


class GraphedCall:
    """Run ``fn`` eagerly on a side stream for the first ``warmup`` calls, then capture it once into a
    ``torch.cuda.CUDAGraph`` and replay it on every later call (the capture call replays it too).

    Every call does the real work (warm-up calls are real decode steps) and returns ``fn``'s output; after
    capture that is the graph's static output tensor, overwritten by the next replay. The capture uses
    ``capture_error_mode='thread_local'`` so that other threads of a training process (data loader pinning,
    async reward clients) may keep using CUDA meanwhile.

    The capture calls ``CUDAGraph.capture_begin``/``capture_end`` itself instead of entering ``torch.cuda.graph``,
    whose entry synchronises the device and empties both caching allocators (device and pinned host) before every
    capture: with one capture per decode call, each later allocation of the step (the loss pass's activations, the
    next call's cache, pinned staging buffers) went back to ``cudaMalloc``/``cudaHostAlloc``, and every ``cudaFree``
    of the emptying blocks the host until the device is idle. Recording launches nothing, so it needs no
    synchronisation: the warm-up step may still be running while the step is recorded. The graphs of one device share
    one memory pool (each capture joins the pool of the device's last graph, :class:`_DeviceGraphs`); they run one at a
    time (one decode call after another), as a shared pool requires.
    """

    def __init__(self, fn: Callable[[], Tensor], device: torch.device, warmup: int = GRAPH_WARMUP_STEPS):
        self.fn, self.device, self.warmup = fn, device, warmup
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: Tensor | None = None

    def __call__(self) -> Tensor:
        self.calls += 1
        with torch.cuda.device(self.device):
            if self.graph is None:
                graphs = _device_graphs(torch.cuda.current_device())
                main, side = torch.cuda.current_stream(), graphs.stream
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    if self.calls <= self.warmup:
                        output = self.fn()
                    else:
                        graph = torch.cuda.CUDAGraph()
                        graph.capture_begin(pool=None if graphs.last is None else graphs.last.pool(),
                                            capture_error_mode="thread_local")
                        try:
                            self.output = self.fn()  # recorded, not executed
                        finally:
                            graph.capture_end()
                        self.graph = graphs.last = graph
                main.wait_stream(side)
                if self.graph is None:
                    output.record_stream(main)  # read on the main stream after the side stream lets go of it
                    return output
            self.graph.replay()
            return self.output
