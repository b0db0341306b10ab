"""Length buckets: padded batch lengths drawn from a few values (prompts left padded, completions right padded).

Every new batch length is a new shape for the GPU work that follows (cuDNN attention plans, allocator blocks,
cuBLAS algorithm choices), paid again by each batch whose longest prompt or completion differs by one token.
Rounding the padded length up to a multiple keeps the shapes to a handful; the padding is masked, so it changes no
value.
"""
from __future__ import annotations


def bucket_length(length: int, multiple: int | None, cap: int | None = None) -> int:
    """``length`` rounded up to a multiple of ``multiple`` (None or 1: unchanged), at most ``max(length, cap)``.

    ``cap`` is the largest length the caller can hold (a completion's ``max_new_tokens``)."""
    if multiple is None or multiple <= 1:
        return length
    padded = -(-length // multiple) * multiple
    return padded if cap is None else max(length, min(padded, cap))


def check_length_multiple(name: str, multiple: int | None) -> None:
    """A length bucket is None (off) or an int >= 1."""
    if multiple is not None and (not isinstance(multiple, int) or isinstance(multiple, bool) or multiple < 1):
        raise ValueError(f"{name}={multiple!r}: expected None (no buckets) or an int >= 1, e.g. 64")
