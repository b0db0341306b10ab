"""Region-level collate: a batch is a plain list of ``RegionSample`` (the GRPO loop consumes lists).

``region_collate`` leaves the images to the step (``grpo.features.encode_step`` preprocesses them);
``PreprocessingCollate`` also runs the processor's host preprocessing of an image batch (``data.prepared``) where
the batch is built, in the DataLoader workers of a training run, and carries it on the batch (``RegionBatch.prepared``).
"""
from __future__ import annotations

from .bad_samples import SkippedSample
from .prepared import PreparedBatch, prepare_batch
from .types import RegionSample, VideoRegionSample


class RegionBatch(list):
    """``list[RegionSample]`` (or of ``VideoRegionSample``) that also carries the samples skipped while building it.

    ``skipped`` travels with the batch out of DataLoader workers, so the main process can count
    bad samples (``bad_samples.count_skipped``) however many workers loaded them. ``prepared`` is the batch's host
    preprocessing (``PreprocessingCollate``), None when the step does it.
    """

    def __init__(self, samples=(), skipped=(), prepared: PreparedBatch | None = None):
        super().__init__(samples)
        self.skipped: list[SkippedSample] = list(skipped)
        self.prepared = prepared

    def __reduce__(self):  # pickle (worker -> main process) keeps `skipped` and `prepared` (one pickle: the
        return type(self), (list(self), self.skipped, self.prepared)  # images shared by samples stay shared)


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


class PreprocessingCollate:
    """``region_collate``, then the processor's host preprocessing of the batch (``data.prepared.prepare_batch``:
    tiles, SAM2 input, gt masks, region cells with ``region_cells``), carried as ``RegionBatch.prepared``.

    Picklable (a DataLoader with workers sends it to each worker); the processor must be the step's (the step
    refuses inputs made under other preprocessing settings).
    """

    def __init__(self, processor, *, region_cells: bool = True) -> None:
        self.processor, self.region_cells = processor, region_cells

    def __call__(self, samples: list) -> RegionBatch:
        batch = region_collate(samples)
        batch.prepared = prepare_batch(self.processor, batch, region_cells=self.region_cells)
        return batch
