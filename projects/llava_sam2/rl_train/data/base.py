"""Shared behaviour of the region datasets: bad-sample policy, final checks, per-process handles."""
from __future__ import annotations

import os
from typing import Callable

import numpy as np
import PIL.Image
from torch.utils.data import Dataset

from .bad_samples import BadSampleError, BadSampleLog, SkippedSample, check_on_bad_sample
from .images import check_alpha_policy
from .types import RegionSample


class RegionDataset(Dataset):
    """Map-style dataset of ``RegionSample``; subclasses implement ``__len__`` and ``load(index)``.

    ``__getitem__`` applies ``on_bad_sample``: ``'raise'`` re-raises ``BadSampleError``; ``'skip'``
    counts it in ``bad_samples`` and returns a ``SkippedSample`` that ``region_collate`` drops.
    Bad samples found while indexing (e.g. a truncated shard) are counted at construction.

    ``input_check`` (set with ``set_input_check``, by the train loop from the model's processor) makes samples the
    model cannot take (an image below the minimum size, a region that hits no region-grid point under
    ``empty_region='raise'``) bad samples at load time, so they never reach a training step.
    """

    def __init__(self, name: str, on_bad_sample: str = "raise", alpha: str = "raise"):
        owner = type(self).__name__
        self.name = name
        self.on_bad_sample = check_on_bad_sample(on_bad_sample, owner)
        self.alpha = check_alpha_policy(alpha, owner)
        self.bad_samples = BadSampleLog()
        self.input_check = None

    def set_input_check(self, check) -> None:
        """Apply ``check`` (``model.text.input_check.InputCheck`` or any object with its ``problem(image, gt_mask)``)
        to every sample loaded from now on."""
        self.input_check = check

    def __len__(self) -> int:
        raise NotImplementedError

    def load(self, index: int) -> RegionSample:
        """Load sample ``index`` or raise ``BadSampleError``."""
        raise NotImplementedError

    def __getitem__(self, index: int) -> RegionSample | SkippedSample:
        if not 0 <= index < len(self):
            raise IndexError(f"{self.name}: index {index} out of range for {len(self)} samples")
        try:
            return self.load(index)
        except BadSampleError as err:
            if self.on_bad_sample == "raise":
                raise
            skipped = SkippedSample.from_error(err)
            self.bad_samples.add(skipped, warn=True)  # logged where it happens, once per process
            return skipped

    @property
    def bad_sample_counts(self) -> dict[str, int]:
        """``{problem: count}`` of bad samples this process has met (index time + loads)."""
        return self.bad_samples.counts

    def index_time_bad(self, err: BadSampleError) -> None:
        """A bad sample found while building the index: raise, or count it and leave it out."""
        if self.on_bad_sample == "raise":
            raise err
        self.bad_samples.add(SkippedSample.from_error(err), warn=True)


def finish_sample(image: PIL.Image.Image, gt_mask: np.ndarray, *, captions: list[str],
                  expressions: list[str], sample_id: str, source: str, file: str,
                  category: str | None = None, input_check=None) -> RegionSample:
    """Last checks shared by all loaders: texts are valid UTF-8, mask shape equals image size, mask not empty,
    and the model's ``input_check`` (when given) accepts the sample."""
    for field, texts in (("caption", captions), ("expression", expressions)):
        for position, text in enumerate(texts):
            check_utf8(text, f"{field} {position}", file=file, sample_id=sample_id)
    width, height = image.size
    if gt_mask.shape != (height, width):
        raise BadSampleError("rle_size_mismatch", f"mask is {list(gt_mask.shape)} [H, W] but the image "
                             f"is [{height}, {width}]", file=file, sample_id=sample_id)
    if not gt_mask.any():
        raise BadSampleError("empty_mask", "the region mask has no pixel", file=file,
                             sample_id=sample_id)
    problem = input_check.problem(image, gt_mask) if input_check is not None else None
    if problem is not None:
        raise BadSampleError(problem[0], problem[1], file=file, sample_id=sample_id)
    return RegionSample(image=image, gt_mask=gt_mask.astype(bool, copy=False), captions=list(captions),
                        expressions=list(expressions), sample_id=sample_id, source=source,
                        category=category)


def check_utf8(text: str, what: str, *, file: str, sample_id: str) -> None:
    """Raise ``bad_text`` for a string that cannot be written as UTF-8 (a lone surrogate such as ``'\\udcff'``,
    left by decoding bytes with ``errors='surrogateescape'``): the tokenizer and the METEOR jar fail on it later,
    far from the file it came from."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise BadSampleError("bad_text", f"{what} {text!r} has an unencodable character at position {err.start}",
                             file=file, sample_id=sample_id) from None


class ProcessLocal:
    """Lazily opened resources (file handles, memory maps), one set per process.

    DataLoader workers are forked or spawned; a child must never use its parent's file offsets, so
    the cache is emptied when the pid changes and is never pickled.
    """

    def __init__(self, opener: Callable):
        self._opener = opener
        self._pid = None
        self._items: dict = {}

    def get(self, key):
        if self._pid != os.getpid():
            self._pid, self._items = os.getpid(), {}  # parent's handles stay open in the parent
        if key not in self._items:
            self._items[key] = self._opener(key)
        return self._items[key]

    def __getstate__(self):
        return {"_opener": self._opener, "_pid": None, "_items": {}}
