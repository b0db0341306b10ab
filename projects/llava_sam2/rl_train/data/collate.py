"""Region-level collate: a batch is a plain list of ``RegionSample`` (the GRPO loop consumes lists;
images are preprocessed later by the model processor)."""
from __future__ import annotations

from .bad_samples import SkippedSample
from .types import RegionSample, VideoRegionSample


class RegionBatch(list):
    """``list[RegionSample]`` (or of ``VideoRegionSample``) that also carries the samples skipped while building it.

    ``skipped`` travels with the batch out of DataLoader workers, so the main process can count
    bad samples (``bad_samples.count_skipped``) however many workers loaded them.
    """

    def __init__(self, samples=(), skipped=()):
        super().__init__(samples)
        self.skipped: list[SkippedSample] = list(skipped)

    def __reduce__(self):  # pickle (worker -> main process) keeps `skipped`
        return type(self), (list(self), self.skipped)


def region_collate(samples: list) -> RegionBatch:
    """Drop ``SkippedSample`` entries (kept in ``.skipped``) and return the rest in order; a tuple item (one region
    and one text sample of ``UnpairedRegionDataset``) contributes its samples in order.

    A batch may come out shorter than the loader's ``batch_size``, or empty, when samples were skipped.
    """
    kept, skipped = [], []
    flat = [s for item in samples for s in (item if isinstance(item, tuple) else (item,))]
    for sample in flat:
        if isinstance(sample, SkippedSample):
            skipped.append(sample)
        elif isinstance(sample, (RegionSample, VideoRegionSample)):
            kept.append(sample)
        else:
            raise TypeError(f"region_collate expects RegionSample, VideoRegionSample or SkippedSample items, got "
                            f"{type(sample).__name__}; use it only with the rl_train region datasets")
    return RegionBatch(kept, skipped)
