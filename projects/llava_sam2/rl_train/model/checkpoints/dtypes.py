"""Floating dtypes by name: the one table that configs, command lines and checkpoint loading read.

A config or a command line names a dtype as text (``torch_dtype='bfloat16'``, ``--dtype float16``), as
``config.json`` does; the loaders take that name or a ``torch.dtype``.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def as_torch_dtype(value: str | torch.dtype | None, where: str = "torch_dtype") -> torch.dtype | None:
    """``value`` as a ``torch.dtype``: a dtype passes through, a name of :data:`DTYPES` is looked up, None stays
    None (the caller's default, e.g. the checkpoint's own dtype)."""
    if value is None or isinstance(value, torch.dtype):
        return value
    if value not in DTYPES:
        raise ValueError(f"{where}={value!r} is not a dtype name; use one of {sorted(DTYPES)}, a torch.dtype or "
                         "None (the checkpoint's).")
    return DTYPES[value]


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Tensors created inside are ``dtype`` unless told otherwise (the previous default comes back on exit)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)
