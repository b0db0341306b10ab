"""Bad-sample errors, the skip record, and the per-problem count every dataset reports.

Rule (docs/data.md, "Bad samples"): a bad sample either raises ``BadSampleError`` naming the file, the sample id and
the problem, or -- when the dataset was built with ``on_bad_sample='skip'`` -- is replaced by a
``SkippedSample`` record that ``region_collate`` drops and counts. Nothing is dropped uncounted.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Iterator

logger = logging.getLogger(__name__)

ON_BAD_SAMPLE = ("raise", "skip")
WARN_FIRST = 5  # skipped samples logged one by one per problem; the rest only in the report

# problem kind -> what the user should do about it (appended to every error message)
PROBLEMS = {
    "corrupt_rle": "re-encode the mask with pycocotools.mask.encode (Fortran-ordered uint8 [H, W])",
    "rle_size_mismatch": "the mask must be stored at the image's full resolution, size = [height, width]",
    "image_size_mismatch": "annotations.json height/width must equal the image file's size",
    "missing_image": "check the image root / file_name, or remove the annotation",
    "missing_member": "re-create the tar shard so it holds <key>.jpg and <key>.pickle for every key",
    "empty_mask": "drop regions whose mask has no pixel",
    "image_mode": "convert the image to RGB, or set alpha='white'|'black'|'drop' for transparent images",
    "bad_image": "the image bytes do not decode; re-encode or remove the file",
    "truncated_shard": "the shard is cut short (interrupted copy?); download or re-write it",
    "bad_conversation": "conversations must be a list of {'from': 'human'|'gpt', 'value': str} "
                        "with one gpt answer per mask",
    "bad_annotation": "fix the annotation record (see the message for the field)",
    "duplicate_id": "make every 'id' unique within 'images' and within 'annotations' (COCO requires it)",
    "bad_text": "text fields must be valid UTF-8 (no lone surrogates such as '\\udcff'); decode the source with its "
                "real encoding and re-save the file",
    "image_too_small": "drop the sample or re-export the image at its real size",
    "missing_frame": "check the frame root and the clip's frame names (or the video file), or remove the clip",
    "missing_mask": "check the mask root: every listed frame needs its mask file, or remove the clip",
    "unknown_object": "the expression names an object id (or annotation id) the clip's annotations do not have; fix "
                      "the id or remove the expression",
    "frame_size_mismatch": "all frames of a clip must have one size; re-extract the frames",
    "region_off_grid": "drop the region, or set model.processor_cfg.empty_region='dilate_to_one_cell' (or 'keep', "
                       "upstream's empty region prompt) and the same empty_region for this dataset's check",
}


def check_on_bad_sample(value: str, owner: str) -> str:
    """Validate the ``on_bad_sample`` knob of dataset ``owner``."""
    if value not in ON_BAD_SAMPLE:
        raise ValueError(
            f"{owner}: on_bad_sample={value!r} is not one of {ON_BAD_SAMPLE}; use 'raise' to stop at the "
            "first bad sample or 'skip' to drop and count bad samples")
    return value


class BadSampleError(ValueError):
    """A sample that cannot be turned into a correct ``RegionSample``."""

    def __init__(self, problem: str, detail: str, *, file: str, sample_id: str):
        if problem not in PROBLEMS:
            raise KeyError(f"unknown bad-sample problem {problem!r}; known: {sorted(PROBLEMS)}")
        self.problem, self.detail, self.file, self.sample_id = problem, detail, str(file), sample_id
        super().__init__(f"{file}: sample {sample_id}: {problem}: {detail}. Fix: {PROBLEMS[problem]}")

    def __reduce__(self):  # keep the keyword-only fields across DataLoader worker pickling
        return _rebuild_error, (self.problem, self.detail, self.file, self.sample_id)


def _rebuild_error(problem, detail, file, sample_id):
    return BadSampleError(problem, detail, file=file, sample_id=sample_id)


@dataclass(frozen=True)
class SkippedSample:
    """What ``__getitem__`` returns in place of a bad sample under ``on_bad_sample='skip'``."""

    sample_id: str
    file: str
    problem: str
    detail: str

    @classmethod
    def from_error(cls, err: BadSampleError) -> "SkippedSample":
        return cls(err.sample_id, err.file, err.problem, err.detail)


class BadSampleLog:
    """Counts skipped samples per problem, by unique sample id (so repeated epochs do not inflate it).

    Each process counts what it loaded itself; with DataLoader workers, count in the main process
    from ``RegionBatch.skipped`` (``count_skipped`` does this while iterating a loader).
    """

    def __init__(self):
        self._ids: dict[str, set[str]] = defaultdict(set)
        self._first: dict[str, SkippedSample] = {}

    def add(self, skipped: SkippedSample, *, warn: bool = False) -> None:
        """Count ``skipped``; with ``warn``, also log it (the first ``WARN_FIRST`` per problem)."""
        ids = self._ids[skipped.problem]
        if warn and skipped.sample_id not in ids and len(ids) < WARN_FIRST:
            logger.warning("skipping bad sample: %s: %s: %s: %s%s", skipped.file, skipped.sample_id,
                           skipped.problem, skipped.detail, "" if len(ids) < WARN_FIRST - 1 else
                           f" (further {skipped.problem} samples are only counted)")
        ids.add(skipped.sample_id)
        self._first.setdefault(skipped.problem, skipped)

    def update(self, items: Iterable[SkippedSample]) -> None:
        for skipped in items:
            self.add(skipped)

    @property
    def counts(self) -> dict[str, int]:
        """``{problem: number of distinct bad samples}``, sorted by problem name."""
        return {problem: len(ids) for problem, ids in sorted(self._ids.items()) if ids}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def report(self, name: str) -> str:
        """One line per problem, with the first offending sample as an example."""
        if not self.total:
            return f"{name}: no bad samples"
        lines = [f"{name}: {self.total} bad sample(s) skipped"]
        for problem, count in self.counts.items():
            first = self._first[problem]
            lines.append(f"  {problem}: {count} (e.g. {first.file}: {first.sample_id}: {first.detail})")
        return "\n".join(lines)


def count_skipped(loader: Iterable, log: BadSampleLog, name: str = "dataset") -> Iterator:
    """Iterate ``loader`` (batches from ``region_collate``), count skips, log the report at the end.

    This is the end-of-epoch report: one pass over the loader is one epoch.
    """
    for batch in loader:
        log.update(getattr(batch, "skipped", ()))
        yield batch
    (logger.warning if log.total else logger.info)(log.report(name))
