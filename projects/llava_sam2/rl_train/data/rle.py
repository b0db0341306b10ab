"""COCO segmentation <-> bool pixel masks, through pycocotools, with every check a silent error needs.

pycocotools does not validate what it decodes: a truncated compressed ``counts`` string decodes to a
mask whose tail is uninitialised memory, an RLE of another size decodes to another shape, and a
list ``counts`` whose runs do not add up to ``H*W`` is accepted. So every decode here

1. checks ``size == [height, width]`` of the image (RLE sizes are ``[H, W]``, PIL sizes ``(W, H)``);
2. for uncompressed RLE checks the runs are non-negative ints summing to ``H*W``;
3. re-encodes the decoded mask and requires the same ``counts`` string back. A truncated or
   corrupted string describes runs that do not tile ``H*W`` pixels, so it can never round-trip.
   (Non-canonical strings, e.g. with zero-length inner runs, are rejected too: pycocotools never
   writes them.)
"""
from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from pycocotools import mask as mask_utils

from .bad_samples import BadSampleError


def encode_mask(gt_mask: np.ndarray) -> dict:
    """bool/uint8 ``[H, W]`` -> compressed RLE ``{"size": [H, W], "counts": str}`` (JSON-ready)."""
    if gt_mask.ndim != 2:
        raise ValueError(f"encode_mask expects a [H, W] mask, got shape {gt_mask.shape}")
    rle = mask_utils.encode(np.asfortranarray(gt_mask.astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def decode_segmentation(segm, height: int, width: int, *, file: str, sample_id: str) -> np.ndarray:
    """COCO ``segmentation`` (polygons, compressed or uncompressed RLE) -> bool ``[height, width]``."""
    if isinstance(segm, list):
        return _decode_polygons(segm, height, width, file=file, sample_id=sample_id)
    if isinstance(segm, dict):
        return decode_rle(segm, height, width, file=file, sample_id=sample_id)
    raise BadSampleError("corrupt_rle", f"segmentation must be a polygon list or an RLE dict, got "
                         f"{type(segm).__name__}", file=file, sample_id=sample_id)


def decode_rle(rle: dict, height: int, width: int, *, file: str, sample_id: str) -> np.ndarray:
    """RLE dict (``counts`` str/bytes or list[int]) -> bool ``[height, width]``, validated."""
    def bad(problem, detail):
        return BadSampleError(problem, detail, file=file, sample_id=sample_id)

    if not isinstance(rle, dict) or "size" not in rle or "counts" not in rle:
        raise bad("corrupt_rle", f"RLE must be a dict with 'size' and 'counts', got {_short(rle)}")
    size = rle["size"]
    if (not isinstance(size, (list, tuple)) or len(size) != 2
            or not all(isinstance(v, Integral) and v > 0 for v in size)):
        raise bad("corrupt_rle", f"RLE size must be [height, width] positive ints, got {_short(size)}")
    if [int(size[0]), int(size[1])] != [int(height), int(width)]:
        raise bad("rle_size_mismatch", f"RLE size [H, W] = {list(size)} but the image is "
                  f"[{height}, {width}] (note: RLE is [height, width], PIL .size is (width, height))")
    counts = rle["counts"]
    if isinstance(counts, list):
        counts = _compress_runs(counts, height, width, bad)
    elif isinstance(counts, str):
        try:
            counts = counts.encode("ascii")
        except UnicodeEncodeError as err:
            raise bad("corrupt_rle", f"compressed counts hold non-ASCII characters ({err})") from None
    elif not isinstance(counts, bytes):
        raise bad("corrupt_rle", f"counts must be str, bytes or list[int], got {type(counts).__name__}")
    compressed = {"size": [int(height), int(width)], "counts": counts}
    try:
        decoded = mask_utils.decode(compressed)  # uint8 [H, W], Fortran order
    except (ValueError, TypeError) as err:
        raise bad("corrupt_rle", f"pycocotools cannot decode counts {_short(counts)} ({err})") from None
    if mask_utils.encode(np.asfortranarray(decoded))["counts"] != counts:
        raise bad("corrupt_rle", f"counts {_short(counts)} do not describe exactly {height}x{width} "
                  "pixels (truncated or corrupted string)")
    return decoded.astype(bool)


def _compress_runs(runs: list, height: int, width: int, bad) -> bytes:
    """Uncompressed RLE runs -> compressed counts, after checking they tile the image exactly."""
    if not all(isinstance(v, Integral) and not isinstance(v, bool) and v >= 0 for v in runs):
        raise bad("corrupt_rle", f"uncompressed RLE runs must be non-negative ints, got {_short(runs)}")
    if sum(runs) != height * width:
        raise bad("corrupt_rle", f"uncompressed RLE runs sum to {sum(runs)} pixels, expected "
                  f"height*width = {height * width}")
    rle = mask_utils.frPyObjects({"size": [height, width], "counts": [int(v) for v in runs]},
                                 height, width)
    return rle["counts"]


def _decode_polygons(polygons: list, height: int, width: int, *, file: str,
                     sample_id: str) -> np.ndarray:
    """COCO polygons ``[[x1, y1, x2, y2, ...], ...]`` (absolute pixels) -> union mask."""
    for poly in polygons:
        if (not isinstance(poly, (list, tuple)) or len(poly) < 6 or len(poly) % 2
                or not all(isinstance(v, Real) and not isinstance(v, bool) for v in poly)):
            raise BadSampleError("bad_annotation", f"each polygon must be a flat list of >= 3 (x, y) "
                                 f"number pairs, got {_short(poly)}", file=file, sample_id=sample_id)
    if not polygons:
        raise BadSampleError("empty_mask", "segmentation is an empty polygon list", file=file,
                             sample_id=sample_id)
    rles = mask_utils.frPyObjects([list(map(float, p)) for p in polygons], height, width)
    return mask_utils.decode(mask_utils.merge(rles)).astype(bool)


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...(" + str(len(text)) + " chars)"
