"""Teacher-forced log-probs of G completions per prompt, each prompt run once for its group, with gradients.

The GRPO loss scores the N = B·G completions of B prompts. Repeating every prompt G times (``completion_logprobs`` on
N rows of ``[prompt | completion]``) costs N·(L + T) tokens forward, recompute and backward; at 896 px (L ≈ 1,350),
B = 8, G = 8 and T = 128 the prompt is 91 % of them. Here each decoder layer runs on two blocks:

* the prefix: the B prompts ``[B, L, D]`` (left padded), causal over their own tokens;
* the continuation: the N completions ``[N, T', D]`` (inputs c_0 .. c_{T'-1}); row ``b·G + g`` attends to prompt b's
  keys/values (repeated to its G rows inside the layer) and causally to its own completion tokens.

Layer ℓ maps ``(h_prefix, h_cont)`` to the next pair; it is one function of its inputs and the layer's weights (the
prompt keys/values live only inside it), so under activation checkpointing (``gradient_checkpointing_enable()``,
train mode, grad enabled) it is checkpointed whole and its recompute in backward builds the same keys again. The
gradient of a prompt token sums over the G completions that read it (the repeat's backward). Cost: B·L + N·T' tokens.

More than one block can read the prefix (:func:`branched_hidden`, :class:`Branch`): each branch has its own rows per
prompt, its own positions and the prefix keys it may see. The cycle's joint pass (``grpo.cycle.joint_action_logps``)
runs loop 1's captions and loop 2's RES prompts (from the end of their image block on) as two branches of loop 1's
prompts, so each image block runs once for both loops.

Partial checkpointing (:func:`keep_last_layers_activations`, ``GRPOConfig.uncheckpointed_layers``): the last k layers
run outside the checkpoint and keep their activations for backward, so backward recomputes k layers fewer, at the
memory of k layers' activations. The last ones, because backward reaches them first: their activations are freed
before the first recompute allocates. Values and gradients are the same either way.

Token t is scored from the state that predicts it, as in ``completion_logprobs``: c_0 from the prompt's last state,
c_t from the continuation's state at input c_{t-1}; positions are ``cumsum(attention) - 1`` over
``[prompt | completion]``. So the values equal the one-pass scoring up to float reordering, and since the rollout's
``old_logp``, the reference's ``ref_logp`` and the loss all run this one function, the first ratio is exactly 1.

Supported: transformers Qwen2 / Qwen3 / Llama / Phi3 bodies (``layers``, ``norm``, ``rotary_emb``; the 4.57 layer API)
with the ``sdpa`` or ``eager`` attention and no sliding window in reach; other LMs are scored by ``completion_logprobs``
on the N repeated rows (same values, the old cost).

Compiled layers (:func:`compile_group_layers`, ``GRPOConfig.compile_loss_layers``): the per-layer call runs through
``torch.compile`` so its elementwise work (LoRA, RMSNorm, rotary, masks) fuses and the Python dispatch of its ~400
operations leaves the host. All decoder layers are one class, so the layer is an argument of the compiled function
(its parameters are graph inputs) and the 2nd..Nth layer reuse the graph of the first; the lengths are symbolic
(``dynamic=True``), so new prompt/completion lengths reuse it too, and a graph is added only per grad mode,
train/eval mode, autocast and adapter state. The compiled call sits inside the per-layer checkpoint, so the recompute in
backward replays the same graph. Every scoring pass of a model (rollout, reference, loss) runs it; the no-grad eval
graph and the training graph are compiled apart and may round differently, so the trainer scores ``old_logp`` with
grad on in the loss pass's mode (``CycleGRPO``, grpo/trainer.py) and the very graph of the loss computes both. A process
that passes torch's recompile limit runs further graphs eagerly (same values).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers.cache_utils import Cache

from .generation import MAX_LOGIT_BYTES, _check_completion, completion_hidden, completion_logprobs, \
    continuation_positions, decoder_and_head, logprob_head_function, position_ids_from_attention
from ..network.torch_seams import without_ddp_graph_splits
from ..network.transformers_seams import attention_implementation, run_decoder_layer

SUPPORTED_ATTENTION = ("sdpa", "eager")  # implementations that take a 4-D additive mask
COMPILE_ATTRIBUTE = "grouped_layer_compile"  # on the decoder body: the torch.compile backend of its layer calls
UNCHECKPOINTED_ATTRIBUTE = "grouped_uncheckpointed_layers"  # on the decoder body: last layers kept out of checkpointing


class GroupKV:
    """The key/value store of ONE layer call on (prefix, branches), in place of a transformers ``Cache``.

    The attention calls ``update(key, value, ...)`` once per block: the first call (prefix, ``[B, Hkv, L, hd]``) is
    kept and returned as is; each later call (a branch, ``[R, Hkv, T', hd]``, ``group_size`` rows per prompt, set
    by the caller before the branch's layer call) returns the prefix repeated to its R rows (row ``b·G + g`` ← prompt b) followed by the branch's
    own: ``[R, Hkv, L + T', hd]``. Built inside the (checkpointed) layer function, so a recompute starts from an empty
    store.
    """

    def __init__(self):
        self.group_size = 1
        self.prefix: tuple[Tensor, Tensor] | None = None

    def update(self, key: Tensor, value: Tensor, layer_idx: int, cache_kwargs=None) -> tuple[Tensor, Tensor]:
        if self.prefix is None:
            self.prefix = (key, value)
            return key, value
        return self._join(self.prefix[0], key), self._join(self.prefix[1], value)  # [R, Hkv, L + T', hd]

    def _join(self, prefix: Tensor, own: Tensor) -> Tensor:
        """``[B, Hkv, L, hd]``, ``[R, Hkv, T', hd]`` → ``[R, Hkv, L + T', hd]``, prompt b's slots before each of its G
        rows' own: one copy (the broadcast prompt and the rows' slots written side by side). An expand, not
        ``repeat_interleave(G)``: a compiled layer whose G is a symbolic size traces it as a view."""
        B, G = prefix.shape[0], self.group_size
        joined = torch.cat([prefix[:, None].expand(B, G, *prefix.shape[1:]),
                            own.reshape(B, G, *own.shape[1:])], dim=3)  # [B, G, Hkv, L + T', hd]
        return joined.reshape(B * G, *joined.shape[2:])


@dataclass
class Branch:
    """Rows that read a shared prefix: row r attends to prefix row ``r // rows_per_prefix`` (the prefix keys that
    ``prefix_visible`` shows) and causally to its own tokens.

    Attributes:
        embeds: ``[R, T, D]`` input embeddings, right padded; mask: ``[R, T]`` bool, the row's real tokens.
        rows_per_prefix: G, with R = B·G.
        positions: ``[R, T]`` long (M-RoPE: ``[3, R, T]``), the rows' positions.
        prefix_visible: ``[B, L]`` bool, the prefix keys the rows of prompt b read; None: all its real tokens.
    """

    embeds: Tensor
    mask: Tensor
    rows_per_prefix: int
    positions: Tensor
    prefix_visible: Tensor | None = None


def additive_bias(is_visible: Tensor, dtype: torch.dtype) -> Tensor:
    """``[n, 1, q, k]`` bool → additive bias: 0 where visible, the dtype's minimum elsewhere. A query row that sees
    nothing (a left-padding position) sees everything instead, as transformers' sdpa path does, so it stays finite."""
    is_visible = is_visible | ~is_visible.any(-1, keepdim=True)
    bias = torch.zeros(is_visible.shape, dtype=dtype, device=is_visible.device)
    return bias.masked_fill_(~is_visible, torch.finfo(dtype).min)


def prefix_bias(prompt_attention: Tensor, dtype: torch.dtype) -> Tensor:
    """``[B, 1, L, L]``: causal over the prompts' real tokens."""
    L = prompt_attention.shape[1]
    prompt_keys = prompt_attention.bool()  # [B, L]
    causal = torch.ones(L, L, dtype=torch.bool, device=prompt_keys.device).tril()  # [L, L]
    return additive_bias(causal[None, None] & prompt_keys[:, None, None, :], dtype)


def branch_bias(prefix_visible: Tensor, mask: Tensor, rows_per_prefix: int, dtype: torch.dtype) -> Tensor:
    """``[R, 1, T, L + T]``: row r sees prefix row r // G's visible keys ``[B, L]``, then its own keys s <= t
    where ``mask [R, T]``."""
    (R, T), L = mask.shape, prefix_visible.shape[1]
    own = torch.ones(T, T, dtype=torch.bool, device=mask.device).tril()[None] & mask.bool()[:, None]  # [R, T, T]
    seen_prefix = prefix_visible.bool().repeat_interleave(rows_per_prefix, 0)[:, None].expand(R, T, L)  # [R, T, L]
    return additive_bias(torch.cat([seen_prefix, own], dim=2)[:, None], dtype)


def _layer_on_group(layer: nn.Module, group_sizes: tuple[int, ...], prefix_kwargs: dict, branch_kwargs: tuple,
                    h_prefix: Tensor, *h_branches: Tensor,
                    prefix_addition: Tensor | None = None, keep_prefix: bool = False) -> tuple[Tensor, ...]:
    """One decoder layer on the prefix ``[B, L, D]``, then on each branch ``[R_i, T_i, D]`` that reads its keys;
    ``prefix_addition [B, L, D]`` is added to the prefix's output (Qwen3-VL's deepstack features: the branches read
    the layer's keys before it, as in transformers). ``keep_prefix``: the prefix's keys and values
    ``[B, Hkv, L, hd]`` follow the outputs."""
    store = GroupKV()
    h_prefix = run_decoder_layer(layer, h_prefix, store, use_cache=True, **prefix_kwargs)  # [B, L, D]
    if prefix_addition is not None:
        h_prefix = h_prefix + prefix_addition.to(h_prefix.dtype)
    outputs = [h_prefix]
    for group_size, kwargs, h_branch in zip(group_sizes, branch_kwargs, h_branches):
        if h_branch.shape[1] == 0:  # one-token completions: c_0 is scored from the prefix alone
            outputs.append(h_branch)
            continue
        store.group_size = group_size
        outputs.append(run_decoder_layer(layer, h_branch, store, use_cache=True, **kwargs))  # [R, T, D]
    return (*outputs, *store.prefix) if keep_prefix else tuple(outputs)


def compile_group_layers(lm: nn.Module, backend: str | None = "inductor") -> None:
    """Run :func:`grouped_hidden`'s per-layer calls on ``lm`` through ``torch.compile(backend=backend)`` from now on
    (None: eagerly again). Kept as a backend name on the decoder body, so copies of the model carry it."""
    body, _ = decoder_and_head(lm)
    setattr(body, COMPILE_ATTRIBUTE, backend)


def keep_last_layers_activations(lm: nn.Module, num_layers: int) -> None:
    """From now on the last ``num_layers`` decoder layers of :func:`grouped_hidden` on ``lm`` run outside activation
    checkpointing when it is on: their activations stay for backward instead of being recomputed (0: every layer
    checkpointed). Kept on the decoder body, so copies of the model carry it."""
    body, _ = decoder_and_head(lm)
    total = body.config.num_hidden_layers
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 0 <= num_layers <= total:
        raise ValueError(f"uncheckpointed_layers={num_layers!r}: {type(lm).__name__} has {total} decoder layers; use "
                         f"an int from 0 (every layer checkpointed) to {total} (none).")
    setattr(body, UNCHECKPOINTED_ATTRIBUTE, num_layers)


def uses_compiled_layers(lm: nn.Module) -> bool:
    """True when :func:`grouped_hidden` runs ``lm``'s layers through torch.compile (:func:`compile_group_layers`)."""
    body, _ = decoder_and_head(lm)
    return getattr(body, COMPILE_ATTRIBUTE, None) is not None


_COMPILED_LAYER_CALLS: dict[str, Callable] = {}  # backend -> the compiled layer call (one per process)


def _layer_call(body: nn.Module, backend: str | None = None) -> Callable:
    """The layer call :func:`grouped_hidden` uses on ``body``: compiled by ``backend`` if given, else per
    :func:`compile_group_layers`, or eager."""
    backend = backend or getattr(body, COMPILE_ATTRIBUTE, None)
    if backend is None:
        return _layer_on_group
    if backend not in _COMPILED_LAYER_CALLS:
        compiled = torch.compile(_layer_on_group, backend=backend, dynamic=True)

        def call(*args, **kwargs):  # one layer per graph: nothing for DDP's graph splitting to overlap
            with without_ddp_graph_splits():
                return compiled(*args, **kwargs)

        _COMPILED_LAYER_CALLS[backend] = call
    return _COMPILED_LAYER_CALLS[backend]


def supports_grouping(lm: nn.Module, length: int) -> bool:
    """True when :func:`grouped_hidden` can run ``lm`` over ``length`` = L + T positions (module docstring)."""
    body, _ = decoder_and_head(lm)
    config = getattr(body, "config", None)
    if not all(hasattr(body, name) for name in ("layers", "norm", "rotary_emb")) or config is None:
        return False
    window = getattr(config, "sliding_window", None)
    uses_window = window is not None and getattr(config, "use_sliding_window", True) and length > window
    return attention_implementation(config) in SUPPORTED_ATTENTION and not uses_window


def _text_axis(positions: Tensor) -> Tensor:
    """``[n, t]`` positions as they are; M-RoPE ``[3, n, t]``: the first axis (what a layer's own position_ids are)."""
    return positions if positions.dim() == 2 else positions[0]


def grouped_hidden(lm: nn.Module, prompt_embeds: Tensor, prompt_attention: Tensor, continuation_ids: Tensor,
                   completion_mask: Tensor, num_generations: int, prompt_positions: Tensor | None = None,
                   prefix_additions: list[Tensor] | None = None, final_norm: bool = True) -> tuple[Tensor, Tensor]:
    """Final-norm states of the prompts' last position ``[B, D]`` and of the continuation inputs ``[N, T', D]``
    (``final_norm=False``: the last decoder layer's output, before the final norm).

    Args:
        prompt_embeds: ``[B, L, D]``; prompt_attention: ``[B, L]`` LEFT padded.
        continuation_ids: ``[N, T']`` long, the completion tokens fed as inputs (c_0 .. c_{T'-1}).
        completion_mask: ``[N, T]`` bool, T >= T' (positions come from its first T' columns).
        prompt_positions: the prompts' own positions (a family seam: Qwen-VL's M-RoPE ``[3, B, L]``); the
            continuation goes on from each row's largest (``generation.continuation_positions``). None: 1-D
            positions counted over the attention.
        prefix_additions: per decoder layer (the first ``len`` ones) ``[B, L, D]`` added to the prompts' states
            after it (Qwen3-VL's deepstack).
    """
    continuation = completion_branch(lm, prompt_attention, continuation_ids, completion_mask, num_generations,
                                     prompt_positions)
    last, (states,) = branched_hidden(lm, prompt_embeds, prompt_attention, [continuation], prompt_positions,
                                      prefix_additions, final_norm)
    return last, states


def completion_branch(lm: nn.Module, prompt_attention: Tensor, continuation_ids: Tensor, completion_mask: Tensor,
                      num_generations: int, prompt_positions: Tensor | None = None) -> Branch:
    """The branch of G completion inputs ``[N, T']`` per prompt (:func:`grouped_hidden`'s arguments): their token
    embeddings, positions going on from each prompt's, all of the prompt's real keys visible."""
    G, L, T_in = num_generations, prompt_attention.shape[1], continuation_ids.shape[1]
    mask = completion_mask[:, :T_in]
    if prompt_positions is None:
        attention = torch.cat([prompt_attention.long().repeat_interleave(G, 0), mask.long()], 1)
        positions = position_ids_from_attention(attention)[:, L:]  # [N, T']
    else:
        positions = continuation_positions(prompt_positions, T_in, G)  # [3, N, T']
    embeds = lm.get_input_embeddings()(continuation_ids)  # [N, T', D]; branched_hidden casts to the prompts' dtype
    return Branch(embeds=embeds, mask=mask, rows_per_prefix=G, positions=positions)


def branched_hidden(lm: nn.Module, prompt_embeds: Tensor, prompt_attention: Tensor, branches: list[Branch],
                    prompt_positions: Tensor | None = None, prefix_additions: list[Tensor] | None = None,
                    final_norm: bool = True, prefix_cache: Cache | None = None,
                    layer_backend: str | None = None) -> tuple[Tensor, list[Tensor]]:
    """The prompts ``[B, L, D]`` (LEFT padded ``prompt_attention``) run once, every branch reading their keys, layer by
    layer (module docstring): the prompts' last states ``[B, D]`` and each branch's states ``[R_i, T_i, D]``,
    final-norm (``final_norm=False``: the last decoder layer's output). ``prompt_positions`` and ``prefix_additions``
    as :func:`grouped_hidden`. ``prefix_cache`` (no gradients): a transformers cache that receives every layer's
    prompt keys/values, as the LM's own forward would fill it. ``layer_backend``: the ``torch.compile`` backend of the
    layer calls for this pass (None: :func:`compile_group_layers`' setting)."""
    L = prompt_attention.shape[1]
    body, _ = decoder_and_head(lm)
    dtype, device = prompt_embeds.dtype, prompt_embeds.device
    prefix_positions = position_ids_from_attention(prompt_attention) if prompt_positions is None else prompt_positions
    # a layer's own position_ids are the text axis (only flash attention reads them); rotary takes them all
    prefix_kwargs = dict(attention_mask=prefix_bias(prompt_attention, dtype), position_ids=_text_axis(prefix_positions),
                         cache_position=torch.arange(L, device=device),
                         position_embeddings=body.rotary_emb(prompt_embeds, prefix_positions))
    branch_kwargs = tuple(dict(
        attention_mask=branch_bias(prompt_attention if branch.prefix_visible is None else branch.prefix_visible,
                                   branch.mask, branch.rows_per_prefix, dtype),
        position_ids=_text_axis(branch.positions),
        cache_position=torch.arange(L, L + branch.mask.shape[1], device=device),
        position_embeddings=body.rotary_emb(branch.embeds, branch.positions)) for branch in branches)
    group_sizes = tuple(branch.rows_per_prefix for branch in branches)
    use_checkpoint = torch.is_grad_enabled() and body.training and getattr(body, "gradient_checkpointing", False)
    num_layers = body.config.num_hidden_layers
    # the last layers are the first backward reaches: their kept activations are freed before any recompute allocates
    first_kept = num_layers - getattr(body, UNCHECKPOINTED_ATTRIBUTE, 0)
    if prefix_cache is not None and torch.is_grad_enabled():
        raise ValueError("branched_hidden: prefix_cache fills a decode cache; call it under torch.no_grad().")
    additions = list(prefix_additions or [])
    layer_call = _layer_call(body, layer_backend)
    states = (prompt_embeds, *(branch.embeds.to(dtype) for branch in branches))
    for index, layer in enumerate(body.layers[:num_layers]):
        step = partial(layer_call, layer, group_sizes, prefix_kwargs, branch_kwargs,
                       prefix_addition=additions[index] if index < len(additions) else None,
                       keep_prefix=prefix_cache is not None)
        if use_checkpoint and index < first_kept:
            states = checkpoint(step, *states, use_reentrant=False)
        else:
            states = step(*states)
        if prefix_cache is not None:
            *states, key, value = states
            prefix_cache.update(key, value, index)
    h_prefix, *h_branches = states
    if not final_norm:
        return h_prefix[:, -1], h_branches
    return body.norm(h_prefix[:, -1]), [body.norm(h) for h in h_branches]  # [B, D], [R_i, T_i, D]


def grouped_completion_hidden(lm: nn.Module, prompt_embeds: Tensor, prompt_attention: Tensor, completion_ids: Tensor,
                              completion_mask: Tensor) -> Tensor:
    """:func:`generation.completion_hidden` (final-norm states at the inputs ``c_0 .. c_{T-1}``, ``[N, T, D]``) of one
    completion per prompt, through the layer calls of :func:`grouped_hidden` with each prompt its own group (G = 1).

    Same values up to float order, but the layers run as the loss pass's do: compiled when the body's layers are
    (:func:`compile_group_layers`), checkpointed per layer with the last ``uncheckpointed_layers`` kept. The
    ``[SEG]`` passes (teacher-forced answers) take it when the layers are compiled (``pipeline.shared``); eager, two
    layer calls per layer cost more host time than transformers' one. LMs the grouped path does not support take
    :func:`generation.completion_hidden`.
    """
    if not supports_grouping(lm, prompt_attention.shape[1] + completion_ids.shape[1]):
        return completion_hidden(lm, prompt_embeds, prompt_attention, completion_ids, completion_mask)  # checks too
    _check_completion(prompt_embeds, prompt_attention, completion_ids, completion_mask, "grouped_completion_hidden")
    _, states = grouped_hidden(lm, prompt_embeds, prompt_attention, completion_ids, completion_mask, 1)
    return states  # [N, T, D]


def grouped_completion_logprobs(
    lm: nn.Module,
    prompt_embeds: Tensor,
    prompt_attention: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    *,
    num_generations: int,
    temperature: float = 1.0,
    max_logit_bytes: int | None = MAX_LOGIT_BYTES,
    return_hidden: bool = False,
    logprob_head: str = "reference",
    prompt_positions: Tensor | None = None,
    prefix_additions: list[Tensor] | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """``completion_logprobs`` of G completions per prompt, each prompt run once (module docstring); differentiable.

    ``token_logp[n, t] = log_softmax(head(h_t) / temperature)[c_t]`` with ``h_0`` the prompt's last state and ``h_t``
    the continuation's state at input ``c_{t-1}``; 0 where ``completion_mask`` is False.

    Args:
        prompt_embeds: ``[B, L, D]``; prompt_attention: ``[B, L]`` LEFT padded.
        completion_ids, completion_mask: ``[N, T]``, N = B·G (row ``b·G + g`` answers prompt b), right padded.
        max_logit_bytes: bound on the fp32 logits of one head call (``generation.token_logprobs``).
        return_hidden: also return ``hidden [N, T, D]``, the final-norm state at the position whose input is
            ``c_t`` (Sa2VA's ``[SEG]`` state where ``c_t`` is ``[SEG]``), as ``completion_logprobs``; the grouped
            path never feeds the last token, so ``hidden[:, T - 1]`` is 0 there.
        logprob_head: a key of ``generation.LOGPROB_HEADS``, how the head scores the tokens.
        prompt_positions, prefix_additions: a family's positions and per-layer prompt additions (:func:`grouped_hidden`;
            the Qwen-VL family's come from ``pipeline.qwen_vl_prompts``); these need the grouped path.

    Returns:
        ``token_logp [N, T]`` float32 (and ``hidden`` when asked).
    """
    G, (B, L) = num_generations, prompt_attention.shape
    if prompt_embeds.dim() != 3 or prompt_embeds.shape[:2] != prompt_attention.shape or \
            not bool(prompt_attention[:, -1].all()):
        raise ValueError(f"grouped_completion_logprobs: prompts must be [B, L, D] embeddings with a LEFT padded "
                         f"[B, L] attention; got {tuple(prompt_embeds.shape)} and {tuple(prompt_attention.shape)}.")
    if completion_ids.dim() != 2 or completion_ids.shape != completion_mask.shape or completion_ids.shape[0] != B * G:
        raise ValueError(
            f"grouped_completion_logprobs: completion_ids and completion_mask must both be [B*G, T] = [{B * G}, T] "
            f"for B={B} prompts and num_generations={G}; got {tuple(completion_ids.shape)} and "
            f"{tuple(completion_mask.shape)}."
        )
    if temperature <= 0:
        raise ValueError(f"grouped_completion_logprobs: temperature must be > 0, got {temperature}.")
    logprob_head_function(logprob_head, "grouped_completion_logprobs")  # a bad name fails before any work
    T = completion_ids.shape[1]
    if not supports_grouping(lm, L + T):
        if prompt_positions is not None or prefix_additions is not None:
            raise ValueError(f"grouped_completion_logprobs: {type(lm).__name__} cannot be scored by the grouped path "
                             "(attention implementation or sliding window), which family positions need.")
        return completion_logprobs(lm, prompt_embeds.repeat_interleave(G, 0), prompt_attention.repeat_interleave(G, 0),
                                   completion_ids, completion_mask, temperature=temperature,
                                   max_logit_bytes=max_logit_bytes, return_hidden=return_hidden,
                                   logprob_head=logprob_head)
    last, continuation = grouped_hidden(lm, prompt_embeds, prompt_attention, completion_ids[:, :-1], completion_mask, G,
                                        prompt_positions, prefix_additions)
    token_logp = completion_logprobs_from_states(lm, last, continuation, completion_ids, completion_mask, G,
                                                 temperature=temperature, max_logit_bytes=max_logit_bytes,
                                                 logprob_head=logprob_head)  # [N, T]
    if return_hidden:  # state at input c_t: the continuation's t-th state; c_{T-1} was never fed
        return token_logp, torch.cat([continuation, torch.zeros_like(continuation[:, :1])], dim=1)  # [N, T, D]
    return token_logp


def completion_logprobs_from_states(lm: nn.Module, last: Tensor, continuation: Tensor, completion_ids: Tensor,
                                    completion_mask: Tensor, num_generations: int, *, temperature: float = 1.0,
                                    max_logit_bytes: int | None = MAX_LOGIT_BYTES,
                                    logprob_head: str = "reference") -> Tensor:
    """The head's part of :func:`grouped_completion_logprobs`: ``token_logp [N, T]`` from the prompts' last states
    ``[B, D]`` (scoring c_0) and the continuation's states ``[N, T - 1, D]`` (scoring c_1 ..)."""
    score = logprob_head_function(logprob_head, "grouped_completion_logprobs")
    _, head = decoder_and_head(lm)
    hidden = torch.cat([last.repeat_interleave(num_generations, 0)[:, None], continuation], dim=1)  # [N, T, D]
    return score(head, hidden, completion_ids, completion_mask, temperature=temperature,
                 max_logit_bytes=max_logit_bytes)  # [N, T]
