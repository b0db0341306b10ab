"""The torch internals that layers below ``engine/`` use (``engine/mmengine_seams.py`` holds those of the engine).

Each item has a canary in ``tests/test_model_seams.py`` that fails, naming the installed torch version, when
an upgrade breaks the assumption.

* ``foreach_copy_`` / ``foreach_lerp_``: torch's fused multi-tensor kernels (``torch._foreach_copy_``,
  ``torch._foreach_lerp_``; the ones ``torch.optim`` runs on). One call updates a whole list of tensors, which is
  what makes the EMA partner's per-iteration lerp over every trainable tensor cheap on the CPU (``grpo/weights.py``);
  the result equals a ``copy_`` / ``lerp_`` per tensor bit for bit.
* ``mark_sizes_symbolic``: which input sizes of a function compiled by ``torch.compile`` vary
  (``torch._dynamo.maybe_mark_dynamic``): those dims get symbolic sizes from the first trace on, each its own symbol
  even where two are equal at trace time, and every other dim stays a constant (a marked dim of size 0 or 1 still
  specialises). The compiled decode step marks its rows, cache slots and lengths (``fast_decode_step``).
* ``without_ddp_graph_splits``: compiles inside the block do not use Dynamo's DDP optimizer
  (``torch._dynamo.config.optimize_ddp``), which splits a graph traced under a ``DistributedDataParallel`` forward at
  the gradient buckets' boundaries so that all-reduce can start between the pieces. The compiled decoder-layer call of
  the loss pass (``grouped_scoring``) is one layer per graph, so there is nothing to overlap, and on 2 H100s the
  splitting failed inside AOTAutograd (``'float' object has no attribute 'meta'``). DDP's own gradient hooks reduce
  the gradients as for any eager layer.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

import torch
import torch._dynamo
from torch import Tensor


def foreach_copy_(destinations: Sequence[Tensor], sources: Sequence[Tensor], non_blocking: bool = False) -> None:
    """``destination.copy_(source)`` for every pair, in one fused call (tensors on one device)."""
    torch._foreach_copy_(destinations, sources, non_blocking=non_blocking)


def foreach_lerp_(tensors: Sequence[Tensor], ends: Sequence[Tensor], weight: float) -> None:
    """``tensor.lerp_(end, weight)`` for every pair, in one fused call."""
    torch._foreach_lerp_(tensors, ends, weight)


def mark_sizes_symbolic(tensor: Tensor, dims: Sequence[int]) -> None:
    """A compiled function traced with ``tensor`` as an input takes sizes ``dims`` of it as symbols, not constants."""
    torch._dynamo.maybe_mark_dynamic(tensor, list(dims))



def without_ddp_graph_splits() -> AbstractContextManager:
    """A context in which ``torch.compile`` traces under a DDP forward into whole graphs (no DDP optimizer)."""
    return torch._dynamo.config.patch(optimize_ddp=False)
