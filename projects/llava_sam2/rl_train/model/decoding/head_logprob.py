"""Completion-token log-probs from the LM head without ``[N, T, V]`` logits (the fast path of ``LOGPROB_HEADS``).

``token_logp[n, t] = z[c] - logsumexp(z)`` with ``z = (W h_{n,t}) / temperature`` in fp32, for the M positions where
``completion_mask`` is True (0 elsewhere). Against the reference head (``generation.token_logprobs``: the head over all
N·T positions in chunks of positions, each chunk checkpointed and recomputed in backward) this path

* scores only the M real tokens: the rows are gathered from ``[N, T, D]`` to ``[M, D]`` before the head, so padding
  after a stop token costs no head GEMM (captions of 32-128 tokens leave ~40 % of a ``[N, 128]`` grid padding);
* pads the head's rows to a multiple of ``VOCAB_ALIGNMENT`` (64) with zeros for the GEMMs and slices the padded columns
  off before the softmax, so the results do not change: an odd vocabulary (151,679 rows on the Qwen presets) makes the
  logits' row stride odd and sends cuBLAS to its slow unaligned (``align1``) kernels;
* is one ``torch.autograd.Function`` per call, chunked over rows so that one chunk of fp32 logits ``[m, V]`` (at most
  ``max_logit_bytes``) exists at a time. With a frozen head (LoRA training) the gradient w.r.t. the states is
  ``dlogp/dh = W^T (onehot(c) - softmax(z)) / temperature`` times the incoming scalar per token, so the forward
  computes the bracket's product while the chunk's logits are at hand and the backward is one multiply: two head
  GEMMs per chunk instead of the reference's three (forward, recompute, backward). With a trainable head the
  backward recomputes each chunk's logits once (the weight gradient needs the incoming gradient).

The arithmetic per row is the reference's (head in the compute dtype, logits cast to fp32, divided by the temperature,
log-sum-exp in fp32), so values agree up to the GEMM's summation order. A non-finite state gives a non-finite log-prob
at its own position, as in the reference; a non-finite state at a masked position is never read here (the reference
scores it and masks the value, but its backward still multiplies a zero gradient by the NaN softmax).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

VOCAB_ALIGNMENT = 64  # head rows padded to a multiple of this: logit rows start on 128-byte boundaries in bf16


def padded_rows(weight: Tensor, multiple: int = VOCAB_ALIGNMENT) -> Tensor:
    """``weight [V, D]`` → ``[V', D]``, V' the next multiple of ``multiple``, extra rows 0 (``weight`` itself when
    already aligned)."""
    V = weight.shape[0]
    pad = -V % multiple
    return weight if pad == 0 else torch.cat([weight, weight.new_zeros(pad, weight.shape[1])])  # [V', D]


def head_compute_dtype(weight: Tensor) -> torch.dtype:
    """The dtype ``F.linear`` runs the head in: autocast's where it is on for the weight's device, else the weight's."""
    device_type = weight.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return weight.dtype


def _scaled_logits(hidden: Tensor, weight_padded: Tensor, vocab: int, temperature: float) -> Tensor:
    """``[m, D]`` → fp32 ``[m, V']`` whose first V columns are ``(W h) / temperature`` (the rest: 0 · whatever)."""
    logits = (hidden @ weight_padded.T).float()  # [m, V']
    logits[:, :vocab].div_(temperature)
    return logits


def _logit_gradient_(logits: Tensor, logsumexp: Tensor, targets: Tensor, vocab: int, scale: Tensor | float) -> Tensor:
    """In place on ``_scaled_logits``' output: ``scale · (onehot(c) - softmax(z))`` in the first V columns, 0 after
    them; ``scale`` is ``1 / temperature`` or ``grad_logp [m, 1] / temperature``. ``[m, V']`` → the same tensor."""
    real = logits[:, :vocab]  # [m, V]
    real.sub_(logsumexp[:, None]).exp_().neg_()  # -softmax(z)
    real[torch.arange(len(targets), device=targets.device), targets] += 1.0
    real.mul_(scale)
    logits[:, vocab:] = 0.0
    return logits


def _head_forward(hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, rows: int,
                  is_grad_in_forward: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(token_logp [M], logsumexp [M], hidden_grad_unit [M, D] or None)``, ``rows`` rows of logits at a time;
    ``hidden_grad_unit = W^T (onehot(c) - softmax(z)) / temperature`` is only computed when asked."""
    dtype = head_compute_dtype(weight)
    M, V = hidden.shape[0], weight.shape[0]
    with torch.autocast(hidden.device.type, enabled=False):
        h, w = hidden.to(dtype), padded_rows(weight.to(dtype))  # [M, D], [V', D]
        token_logp = torch.empty(M, dtype=torch.float32, device=hidden.device)  # [M]
        logsumexp = torch.empty_like(token_logp)  # [M]
        hidden_grad_unit = torch.empty_like(h) if is_grad_in_forward else None  # [M, D]
        for r0 in range(0, M, rows):
            r1 = min(M, r0 + rows)
            logits = _scaled_logits(h[r0:r1], w, V, temperature)  # [m, V']
            logsumexp[r0:r1] = logits[:, :V].logsumexp(-1)
            token_logp[r0:r1] = logits[:, :V].gather(1, targets[r0:r1, None]).squeeze(1) - logsumexp[r0:r1]
            if is_grad_in_forward:
                gradient = _logit_gradient_(logits, logsumexp[r0:r1], targets[r0:r1], V, 1.0 / temperature)
                hidden_grad_unit[r0:r1] = gradient.to(dtype) @ w  # [m, D]
    return token_logp, logsumexp, hidden_grad_unit


class HeadLogprob(torch.autograd.Function):
    """``(hidden [M, D], weight [V, D], targets [M]) → token_logp [M]`` fp32, ``rows`` rows of logits at a time."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, rows: int) -> Tensor:
        is_hidden_grad, is_weight_grad = ctx.needs_input_grad[:2]
        is_grad_in_forward = is_hidden_grad and not is_weight_grad  # frozen head: dlogp/dh is fixed by the forward
        token_logp, logsumexp, hidden_grad_unit = _head_forward(hidden, weight, targets, temperature, rows,
                                                                is_grad_in_forward)
        if is_grad_in_forward:
            ctx.save_for_backward(hidden_grad_unit)
        else:
            ctx.save_for_backward(hidden, weight, targets, logsumexp)
        ctx.is_grad_in_forward, ctx.hidden_dtype = is_grad_in_forward, hidden.dtype
        ctx.temperature, ctx.rows, ctx.dtype = temperature, rows, head_compute_dtype(weight)
        return token_logp

    @staticmethod
    def backward(ctx, grad_logp: Tensor):
        if ctx.is_grad_in_forward:
            (hidden_grad_unit,) = ctx.saved_tensors
            return (grad_logp[:, None] * hidden_grad_unit.float()).to(ctx.hidden_dtype), None, None, None, None
        hidden, weight, targets, logsumexp = ctx.saved_tensors
        dtype, rows, M, V = ctx.dtype, ctx.rows, hidden.shape[0], weight.shape[0]
        is_hidden_grad, is_weight_grad = ctx.needs_input_grad[:2]
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), padded_rows(weight.to(dtype))  # [M, D], [V', D]
            grad_hidden = torch.empty_like(h) if is_hidden_grad else None  # [M, D]
            grad_weight = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if is_weight_grad else None
            for r0 in range(0, M, rows):
                r1 = min(M, r0 + rows)
                logits = _scaled_logits(h[r0:r1], w, V, ctx.temperature)  # [m, V']
                scale = grad_logp[r0:r1, None] / ctx.temperature  # [m, 1]
                gradient = _logit_gradient_(logits, logsumexp[r0:r1], targets[r0:r1], V, scale).to(dtype)  # [m, V']
                if is_hidden_grad:
                    grad_hidden[r0:r1] = gradient @ w  # [m, D]
                if is_weight_grad:
                    grad_weight += (gradient.T @ h[r0:r1]).float()  # [V', D]
        grad_hidden = grad_hidden.to(ctx.hidden_dtype) if is_hidden_grad else None
        grad_weight = grad_weight[:V].to(weight.dtype) if is_weight_grad else None  # [V, D]
        return grad_hidden, grad_weight, None, None, None


def fused_token_logprobs(head: nn.Module, hidden: Tensor, completion_ids: Tensor, completion_mask: Tensor, *,
                         temperature: float = 1.0, max_logit_bytes: int | None = None) -> Tensor:
    """``log_softmax(head(hidden) / temperature)[completion_ids]`` where ``completion_mask``, else 0 (module docstring).

    Args:
        head: the LM's output head, a bias-free ``nn.Linear`` ``[V, D]`` (a LoRA-wrapped head has no plain weight to
            pad: score it with the reference head).
        hidden: ``[N, T, D]``, the state that predicts each token; completion_ids, completion_mask: ``[N, T]``.
        max_logit_bytes: bound on one chunk's fp32 logits (``m·V·4`` bytes); None scores all M rows at once.

    Returns:
        ``token_logp [N, T]`` float32, differentiable w.r.t. ``hidden`` and the head's weight (when they need grad).
    """
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise TypeError(f"fused_token_logprobs: the LM head must be a bias-free nn.Linear, got {type(head).__name__}"
                        f"{' with a bias' if isinstance(head, nn.Linear) else ''}; use logprob_head='reference'.")
    if temperature <= 0:
        raise ValueError(f"fused_token_logprobs: temperature must be > 0, got {temperature}.")
    if head.weight.dim() != 2 or head.weight.shape[1] != hidden.shape[-1]:  # e.g. a DeepSpeed ZeRO-3 partition
        raise ValueError(f"fused_token_logprobs: the head weight is {tuple(head.weight.shape)}, not [V, "
                         f"{hidden.shape[-1]}] (a partitioned weight is read only through the module's own call); "
                         "use logprob_head='reference'.")
    is_real = completion_mask.bool()  # [N, T]
    rows_hidden, targets = hidden[is_real], completion_ids[is_real]  # [M, D], [M]
    V, M = head.weight.shape[0], rows_hidden.shape[0]
    rows = max(1, M) if max_logit_bytes is None else max(1, int(max_logit_bytes) // (V * 4))
    if torch.is_grad_enabled() and (rows_hidden.requires_grad or head.weight.requires_grad):
        token_logp = HeadLogprob.apply(rows_hidden, head.weight, targets, float(temperature), rows)  # [M]
    else:
        with torch.no_grad():
            token_logp = _head_forward(rows_hidden, head.weight, targets, float(temperature), rows, False)[0]  # [M]
    out = torch.zeros(completion_ids.shape, dtype=torch.float32, device=hidden.device)  # [N, T]
    return out.masked_scatter(is_real, token_logp)
