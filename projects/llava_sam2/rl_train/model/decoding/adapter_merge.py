"""Decode from merged scratch copies of the LoRA-adapted weights, the live parameters untouched.

A peft LoRA Linear computes ``y = W x + b + Σ_a s_a · B_a A_a dropout(x)``: besides the base GEMM, about four small
kernels per adapter (dropout, A, B, scale-and-add), 28 extra per Qwen2 layer, and the adapters' reads on every
decode step. Inside :func:`merged_adapters` each such layer computes ``y = W' x + b`` with the scratch weight

    W' = W + Σ_a s_a · B_a A_a        (peft's ``get_delta_weight``, added in fp32, rounded once to W's dtype)

built once when the block is entered: one GEMM per linear, as in the bare LM. ``W'`` equals the adapted layer up to
float rounding (bf16: W' rounds the sum; the adapter path rounds the product), so decoding is unchanged in
distribution.

The live tensors (W, A, B) are only read: nothing is written, so ``grpo.weights.WeightSets`` swaps restore
bit-exactly, and a block entered inside ``WeightSets.partner`` merges the partner's adapters. A layer keeps its own
forward when merging would change what it computes: adapters disabled (``disable_adapter()``: the reference policy)
or already merged, a non-vanilla variant (DoRA), or an active dropout (train mode with p > 0). The switch is the
layer's class: inside the block it is a subclass whose ``forward`` reads the scratch weight (the same class on every
call, so a compiled decode step does not recompile), restored in ``finally``.

Memory: one scratch copy of every merged weight for the block's duration (4b preset: about 5.5 GB in bf16).
"""
from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MERGED_WEIGHT = "sa2va_merged_weight"  # the scratch tensor's attribute on a merged layer


class MergedForward:
    """Placed first in the class of a merged LoRA Linear inside :func:`merged_adapters`: ``y = W' x + b``."""

    def forward(self, x: Tensor, *args, **kwargs) -> Tensor:
        return F.linear(x, getattr(self, MERGED_WEIGHT), self.base_layer.bias)


@functools.cache
def merged_class(cls: type) -> type:
    """The subclass of a LoRA layer class whose forward is :class:`MergedForward`'s (one per class, cached)."""
    return type(f"Merged{cls.__name__}", (MergedForward, cls), {})


def _is_mergeable(module: nn.Module) -> bool:
    """A peft LoRA layer over an ``nn.Linear`` whose active adapters are all plain LoRA with inactive dropout."""
    base = getattr(module, "base_layer", None)
    if not isinstance(base, nn.Linear) or not hasattr(module, "lora_A") or not hasattr(module, "get_delta_weight"):
        return False
    if getattr(module, "disable_adapters", False) or getattr(module, "merged", False):
        return False
    active = [a for a in module.active_adapters if a in module.lora_A]
    if not active or any(a in getattr(module, "lora_variant", {}) for a in active):
        return False
    dropouts = [module.lora_dropout[a] for a in active]
    return all(not d.training or getattr(d, "p", 0.0) == 0 for d in dropouts)


@torch.no_grad()
def _merged_weight(module: nn.Module) -> Tensor:
    """``W + Σ_a s_a B_a A_a`` in fp32, rounded once to W's dtype: ``[out, in]``."""
    weight = module.base_layer.weight
    merged = weight.float()
    with torch.autocast(weight.device.type, enabled=False):  # inside a rollout's autocast B A would round to bf16
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                merged = merged + module.get_delta_weight(adapter).float()
    return merged.to(weight.dtype)


@contextmanager
def merged_adapters(lm: nn.Module) -> Iterator[int]:
    """Inside the block, every mergeable LoRA Linear of ``lm`` runs on a merged scratch weight (module docstring).

    Yields the number of merged layers (0 for an LM without LoRA: the block changes nothing).
    """
    layers = [m for m in lm.modules() if _is_mergeable(m)]
    switched: list[tuple[nn.Module, type]] = []
    try:
        for module in layers:
            switched.append((module, type(module)))
            setattr(module, MERGED_WEIGHT, _merged_weight(module))
            module.__class__ = merged_class(type(module))
        yield len(layers)
    finally:
        for module, cls in switched:
            module.__class__ = cls
            if MERGED_WEIGHT in vars(module):
                delattr(module, MERGED_WEIGHT)


def _computes_adapter(module: nn.Module) -> bool:
    """A LoRA layer that will run its adapters (B A x) on its next call: not merged, adapters not disabled."""
    return hasattr(module, "lora_A") and not isinstance(module, MergedForward) and \
        not getattr(module, "disable_adapters", False)


def autocast_off_when_merged(lm: nn.Module):
    """Inside :func:`merged_adapters`: autocast off when no adapter of ``lm`` still computes, else nothing.

    The rollout runs under the AMP autocast for peft's fp32 adapters (``lora.adapter_compute_dtype``); once every
    adapter is merged (or disabled) the LM is bf16 end to end, and autocast would only add its per-op dispatch to the
    decode's eager kernels. With any adapter left computing (active dropout, DoRA) autocast stays: its bf16 input
    would otherwise meet an fp32 weight.
    """
    if any(_computes_adapter(m) for m in lm.modules()):
        return nullcontext()
    device = next(lm.parameters()).device.type
    return torch.autocast(device, enabled=False)
