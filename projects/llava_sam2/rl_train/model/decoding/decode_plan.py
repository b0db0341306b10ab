"""Opt-in variants of the fast decode step that cut its kernels without changing what it computes.

:class:`StepPlan` is built once per :func:`fast_generation.fast_sample_completions` call (after
``adapter_merge.merged_adapters`` has built its scratch weights) and read by ``fast_decode_step.decode_logits``:

* **Padded LM head** (``pad_head``): the head weight copied into ``[Vp, D]`` rows, ``Vp`` the vocabulary rounded
  up to :data:`HEAD_ROW_ALIGN` and the extra rows zero. An odd vocabulary (Sa2VA-4B: 151,679) gives the ``[N, V]``
  logits an odd row stride, which confines cuBLAS to its 1-element-aligned kernels; ``[N, Vp]`` does not. The
  padded columns are sliced off before anything reads the logits, so sampling, ``token_logp`` and the noise drawn
  per step (``[N, V]``) are those of the unpadded head.
* **Fused layers** (``fuse_layers``): each Qwen2/Llama-style decoder layer runs :meth:`FusedLayer.step` instead of
  its transformers forward: one GEMM on a scratch ``[Wq; Wk; Wv]`` (and biases) instead of three, one on
  ``[Wgate; Wup]`` instead of two, rotary applied once to the joined query|key heads, and each RMSNorm as
  ``weight · rms_norm(x.float()).to(dtype)`` (``F.rms_norm``: a fused normalisation kernel where torch has one,
  instead of the module's six elementwise and reduction kernels). Every
  output element is the same sum of the same products as in the layer's own forward; only the order a kernel
  sums in may differ, so results agree to float rounding (fp32: ~1e-6; the CPU tests hold tokens equal and
  ``token_logp`` within 1e-5). A layer whose projections are not plain (or merged) linears, or that normalises
  queries/keys per head (Qwen3), keeps its own forward.
* **Attention** (``attention``): which one-query attention the step runs over the static cache — ``grouped``
  (``gqa_decode_attention``: the r query heads of a KV head read as r queries of it), ``sdpa_gqa``
  (``scaled_dot_product_attention(enable_gqa=True)``) or ``flex`` (``flex_attention`` with the additive bias as its
  score modifier; fast only under ``compile_step``, eager it is a reference implementation).
* **Split prompt cache** (``split_prompt_cache``, with ``fuse_layers``): :class:`SplitPromptCache` keeps the B
  prompts' keys/values once and the N rows' new tokens apart; each step reads a prompt's keys/values once for its G
  rows (one GEMM of G·r queries against them) and joins both parts as one softmax in fp32.

Memory: the fused and padded weights are scratch copies for the call (4b preset: ~3.6 GB for q|k|v and gate|up,
~0.6 GB for the head).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import flex_attention
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .adapter_merge import MERGED_WEIGHT, MergedForward
from .prefix_attention import shared_prefix_decode_attention

HEAD_ROW_ALIGN = 64  # padded vocabulary multiple: 16-byte aligned bf16/fp32 logit rows
SDPA_GQA_ATTENTION = "sa2va_sdpa_gqa_decode"
FLEX_DECODE_ATTENTION = "sa2va_flex_decode"


def sdpa_gqa_decode_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                              attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                              **kwargs) -> tuple[Tensor, None]:
    """One-query attention with SDPA's own grouped-query support: ``query [N, H, 1, hd]``, ``key/value
    [N, Hkv, S, hd]``, additive ``attention_mask [N, 1, 1, S]`` → ``([N, 1, H, hd], None)``."""
    if query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, enable_gqa=True)  # [N, H, 1, hd]
    return out.transpose(1, 2), None


def flex_decode_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                          attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          **kwargs) -> tuple[Tensor, None]:
    """One-query attention through ``flex_attention``: the additive bias ``[N, 1, 1, S]`` is added to each score
    (``score + bias[n, kv]``), KV heads shared by ``H / Hkv`` query heads (``enable_gqa``)."""
    if query.shape[2] != 1 or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    bias = attention_mask

    def add_bias(score, batch, head, q_index, kv_index):
        return score + bias[batch, 0, 0, kv_index]

    out = flex_attention(query, key, value, score_mod=None if bias is None else add_bias, scale=scaling,
                         enable_gqa=True)  # [N, H, 1, hd]
    return out.transpose(1, 2), None


ALL_ATTENTION_FUNCTIONS[SDPA_GQA_ATTENTION] = sdpa_gqa_decode_attention
ALL_ATTENTION_FUNCTIONS[FLEX_DECODE_ATTENTION] = flex_decode_attention


def linear_weights(module: nn.Module) -> tuple[Tensor, Tensor | None] | None:
    """``(weight, bias)`` that ``module(x)`` applies as ``x Wᵀ + b``: a plain ``nn.Linear``, or a LoRA linear merged
    by ``adapter_merge.merged_adapters``; None for anything else (live adapters, quantised layers)."""
    if isinstance(module, MergedForward):
        return getattr(module, MERGED_WEIGHT), module.base_layer.bias
    if type(module) is nn.Linear:
        return module.weight, module.bias
    return None


def rms_norm(norm: nn.Module, x: Tensor) -> Tensor:
    """``norm(x)`` for a Qwen2/Llama RMSNorm (``weight · (x / rms(x)).to(dtype)``, the rms in fp32) with the
    normalisation in one ``F.rms_norm`` kernel; any other norm module is called as is."""
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None or type(norm).__name__ not in ("Qwen2RMSNorm", "LlamaRMSNorm"):
        return norm(x)
    return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _joined(parts: list[tuple[Tensor, Tensor | None]]) -> tuple[Tensor, Tensor | None]:
    """Row-concatenated weights ``[Σ out, in]`` and biases (zeros where a part has none; None if none has one)."""
    weight = torch.cat([w for w, _ in parts])
    if all(b is None for _, b in parts):
        return weight, None
    return weight, torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in parts])


@dataclass(frozen=True)
class FusedLayer:
    """A Qwen2/Llama decoder layer's decode step on joined scratch weights (module docstring)."""

    layer: nn.Module
    qkv_weight: Tensor  # [(H + 2 Hkv) hd, D]
    qkv_bias: Tensor | None
    gate_up_weight: Tensor  # [2 I, D]
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, layer: nn.Module) -> FusedLayer | None:
        """The fused form of ``layer``, or None when it cannot be fused without changing what it computes."""
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        names = type(layer).__name__
        if names not in ("Qwen2DecoderLayer", "LlamaDecoderLayer") or attn is None or mlp is None:
            return None
        if getattr(attn, "sliding_window", None) or getattr(attn.config, "pretraining_tp", 1) != 1:
            return None
        projections = [linear_weights(getattr(attn, n, None)) for n in ("q_proj", "k_proj", "v_proj")]
        gate_up = [linear_weights(getattr(mlp, n, None)) for n in ("gate_proj", "up_proj")]
        if any(p is None for p in projections + gate_up) or any(b is not None for _, b in gate_up):
            return None
        qkv_weight, qkv_bias = _joined(projections)
        hd = attn.head_dim
        return cls(layer=layer, qkv_weight=qkv_weight, qkv_bias=qkv_bias,
                   gate_up_weight=_joined(gate_up)[0], num_heads=projections[0][0].shape[0] // hd,
                   num_kv_heads=projections[1][0].shape[0] // hd, head_dim=hd)

    def step(self, hidden: Tensor, cache, attention_bias: Tensor, rope: tuple[Tensor, Tensor],
             cache_position: Tensor, attention: str) -> Tensor:
        """``hidden [N, 1, D]`` → the layer's output ``[N, 1, D]``; writes this token's key/value into ``cache``."""
        attn, mlp = self.layer.self_attn, self.layer.mlp
        N, H, Hkv, hd = hidden.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = F.linear(rms_norm(self.layer.input_layernorm, hidden), self.qkv_weight, self.qkv_bias)  # [N, 1, ·]
        query_key = qkv[..., :(H + Hkv) * hd].view(N, 1, H + Hkv, hd)
        value = qkv[..., (H + Hkv) * hd:].view(N, 1, Hkv, hd).transpose(1, 2)  # [N, Hkv, 1, hd]
        cos, sin = rope[0][:, :, None], rope[1][:, :, None]  # [N, 1, 1, hd]: broadcast over heads
        query_key = query_key * cos + _rotate_half(query_key) * sin
        query, key = query_key[:, :, :H].transpose(1, 2), query_key[:, :, H:].transpose(1, 2)
        if isinstance(cache, SplitPromptCache):
            out = cache.attention(attn.layer_idx, query, key, value, attention_bias, cache_position, attn.scaling)
        else:
            key, value = cache.update(key, value, attn.layer_idx, {"cache_position": cache_position})
            out, _ = ALL_ATTENTION_FUNCTIONS[attention](attn, query, key, value, attention_bias, scaling=attn.scaling)
        hidden = hidden + attn.o_proj(out.reshape(N, 1, H * hd))
        gate, up = F.linear(rms_norm(self.layer.post_attention_layernorm, hidden), self.gate_up_weight).chunk(2, -1)
        return hidden + mlp.down_proj(mlp.act_fn(gate) * up)


def _matmul_fp32(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` ``[..., m, k] @ [..., k, n]`` with an fp32 result (bf16 inputs on CUDA: fp32 accumulate and output,
    as a fused attention kernel keeps its scores; elsewhere the inputs are promoted)."""
    if a.dtype == torch.float32 and b.dtype == torch.float32:
        return torch.matmul(a, b)
    if a.is_cuda:
        batch = a.shape[:-2]
        out = torch.bmm(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]), out_dtype=torch.float32)
        return out.view(*batch, *out.shape[-2:])
    return torch.matmul(a.float(), b.float())


@dataclass(frozen=True)
class SplitPromptCache:
    """The decode cache as the B prompts' keys/values (read once per step for all G rows of a prompt) plus the N rows'
    own new tokens, instead of N full rows holding G copies of each prompt.

    A step of the full cache reads ``N · S`` key/value slots per layer; this one ``B · L + N · (S - L)`` (4b, N=64,
    G=8, L=1850, S=1984: 4.68 → 0.86 GB per step). The two parts are joined exactly as one softmax:
    ``out = (Σ_prefix e^{s - m} v + Σ_tail e^{s - m} v) / (Σ_prefix e^{s - m} + Σ_tail e^{s - m})`` with ``m`` the
    row's largest score over both, scores and sums in fp32.
    """

    prefix: tuple[tuple[Tensor, Tensor], ...]  # per layer (keys, values) [B, Hkv, L, hd]
    tail: tuple[tuple[Tensor, Tensor], ...]  # per layer (keys, values) [N, Hkv, S - L, hd]; position L + j: slot j
    kernel: bool = False  # attend with prefix_attention's Triton kernels instead of the torch ops below

    @classmethod
    def of(cls, prompt_layers: list[tuple[Tensor, Tensor]], rows: int, num_slots: int, kernel: bool = False,
           own_layers: list[tuple[Tensor, Tensor]] | None = None) -> SplitPromptCache:
        """``prompt_layers``: per layer the B shared prompts' ``[B, Hkv, L, hd]``; ``rows`` = B·G; ``own_layers``:
        per layer ``[n, Hkv, S_own, hd]`` tokens that each of n prompt rows has after the shared part (a shared
        image prefix followed by a row's own question), copied to the first tail slots of the row's G samples."""
        prefix = tuple((k.contiguous(), v.contiguous()) for k, v in prompt_layers)
        _, Hkv, L, hd = prefix[0][0].shape
        tail = tuple((k.new_zeros(rows, Hkv, num_slots - L, hd), v.new_zeros(rows, Hkv, num_slots - L, hd))
                     for k, v in prefix)
        for (tail_key, tail_value), (own_key, own_value) in zip(tail, own_layers or ()):
            n, _, own, _ = own_key.shape
            tail_key[:, :, :own].view(n, rows // n, Hkv, own, hd).copy_(own_key[:, None])
            tail_value[:, :, :own].view(n, rows // n, Hkv, own, hd).copy_(own_value[:, None])
        # L stays a shape, not an int: a compiled step sees a new L as a shape
        return cls(prefix=prefix, tail=tail, kernel=kernel)

    def attention(self, layer_idx: int, query: Tensor, key: Tensor, value: Tensor, attention_bias: Tensor,
                  cache_position: Tensor, scaling: float) -> Tensor:
        """Store this step's ``key/value [N, Hkv, 1, hd]`` and attend ``query [N, H, 1, hd]`` over prompt and tail
        (``attention_bias [N, 1, 1, S]``, rows of one prompt sharing its first L columns) → ``[N, 1, H, hd]``."""
        prefix_key, prefix_value = self.prefix[layer_idx]
        tail_key, tail_value = self.tail[layer_idx]
        B, Hkv, L, hd = prefix_key.shape
        slot = cache_position - L
        tail_key.index_copy_(2, slot, key.to(tail_key.dtype))
        tail_value.index_copy_(2, slot, value.to(tail_value.dtype))
        N, H = query.shape[:2]
        G, r = N // B, H // Hkv
        if self.kernel:
            out = shared_prefix_decode_attention(query[:, :, 0], prefix_key, prefix_value,
                                                 attention_bias[::G, 0, 0, :L], tail_key, tail_value,
                                                 attention_bias[:, 0, 0, L:], slot + 1, scaling)  # [N, H, hd]
            return out.reshape(N, 1, H, hd)

        def to_rows(x: Tensor) -> Tensor:  # [B, Hkv, G·r, c] -> [N, Hkv, r, c]
            return x.reshape(B, Hkv, G, r, x.shape[-1]).transpose(1, 2).reshape(N, Hkv, r, x.shape[-1])

        def to_prompts(x: Tensor) -> Tensor:  # [N, Hkv, r, c] -> [B, Hkv, G·r, c]
            return x.reshape(B, G, Hkv, r, x.shape[-1]).transpose(1, 2).reshape(B, Hkv, G * r, x.shape[-1])

        query_rows = query.reshape(N, Hkv, r, hd)  # the r query heads of a KV head (head h = kv·r + i)
        prefix_scores = _matmul_fp32(to_prompts(query_rows), prefix_key.transpose(-1, -2)) * scaling \
            + attention_bias[::G, :, :, :L].float()  # [B, Hkv, G·r, L]
        tail_scores = _matmul_fp32(query_rows, tail_key.transpose(-1, -2)) * scaling \
            + attention_bias[:, :, :, L:].float()  # [N, Hkv, r, S - L]
        top = torch.maximum(to_rows(prefix_scores.amax(-1, keepdim=True)), tail_scores.amax(-1, keepdim=True))
        prefix_weights = torch.exp(prefix_scores - to_prompts(top))  # [B, Hkv, G·r, L]
        tail_weights = torch.exp(tail_scores - top)  # [N, Hkv, r, S - L]
        total = to_rows(prefix_weights.sum(-1, keepdim=True)) + tail_weights.sum(-1, keepdim=True)
        mixed = to_rows(_matmul_fp32(prefix_weights.to(prefix_value.dtype), prefix_value)) \
            + _matmul_fp32(tail_weights.to(tail_value.dtype), tail_value)  # [N, Hkv, r, hd]
        return (mixed / total).to(query.dtype).reshape(N, 1, H, hd)


@dataclass(frozen=True)
class StepPlan:
    """What ``decode_logits`` runs besides the LM's own modules (module docstring)."""

    attention: str  # a key of transformers' ALL_ATTENTION_FUNCTIONS
    layers: tuple[FusedLayer | None, ...] | None  # per decoder layer; None: every layer runs its own forward
    head_weight: Tensor | None  # [Vp, D] zero-padded head, or None: the head module
    head_bias: Tensor | None
    vocab_size: int

    def norm(self, norm: nn.Module, x: Tensor) -> Tensor:
        return rms_norm(norm, x) if self.layers is not None else norm(x)

    def logits(self, head: nn.Module, normed: Tensor) -> Tensor:
        """``head(normed)`` ``[..., V]``; through the padded weight when there is one (a view of ``[..., Vp]``)."""
        if self.head_weight is None:
            return head(normed)
        return F.linear(normed, self.head_weight, self.head_bias)[..., :self.vocab_size]


ATTENTIONS = {"grouped": None, "sdpa_gqa": SDPA_GQA_ATTENTION, "flex": FLEX_DECODE_ATTENTION}  # None: the default


def build_step_plan(layers: nn.ModuleList, head: nn.Module, *, default_attention: str, attention: str = "grouped",
                    fuse_layers: bool = False, pad_head: bool = False) -> StepPlan:
    """The plan of one decode call (scratch weights built here, read-only afterwards)."""
    if attention not in ATTENTIONS:
        raise ValueError(f"decode attention {attention!r} is not one of {sorted(ATTENTIONS)}")
    fused = tuple(FusedLayer.of(layer) for layer in layers) if fuse_layers else None
    head_weight = head_bias = None
    weights = linear_weights(head) if pad_head else None
    vocab = weights[0].shape[0] if weights is not None else getattr(head, "out_features", 0)
    padded = -(-vocab // HEAD_ROW_ALIGN) * HEAD_ROW_ALIGN
    if weights is not None and padded != vocab:
        weight, bias = weights
        head_weight = torch.cat([weight, weight.new_zeros(padded - vocab, weight.shape[1])])
        head_bias = None if bias is None else torch.cat([bias, bias.new_zeros(padded - vocab)])
    return StepPlan(attention=ATTENTIONS[attention] or default_attention, layers=fused, head_weight=head_weight,
                    head_bias=head_bias, vocab_size=vocab)
