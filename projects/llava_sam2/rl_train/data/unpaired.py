"""Unpaired region data for the cycle loops: regions without text for loop 1, texts without masks for loop 2.

Cycle RL's use case is a domain with no paired (caption, mask) data: loop 1 (mask -> caption -> mask') needs only
regions of images (e.g. automatic masks), loop 2 (caption -> mask -> caption') only texts about other images.
``UnpairedRegionDataset`` zips two region datasets so that every item holds one sample of each: item ``i`` is
``(regions[i], texts[i % len(texts)])``; ``region_collate`` lays the pairs out flat, so a batch of B items carries
B region-only and B text-only samples and each loop gets B prompts, as with paired data.
"""
from __future__ import annotations

from torch.utils.data import Dataset

from .bad_samples import SkippedSample
from .types import RegionSample


def has_region(sample: RegionSample) -> bool:
    """The sample carries a region mask (loop 1 can use it)."""
    return sample.gt_mask is not None


def has_text(sample: RegionSample) -> bool:
    """The sample carries a caption or a referring expression (loop 2 can ground it)."""
    return any(isinstance(t, str) and t.strip() for t in [*sample.captions, *sample.expressions])


class UnpairedRegionDataset(Dataset):
    """Items ``(region sample, text sample)`` from two region datasets of disjoint images.

    Args:
        regions: samples with a mask (their texts, if any, are dropped so no loop can read a paired caption).
        texts: samples with a caption or expression (their masks, if any, are dropped likewise).
    """

    def __init__(self, regions: Dataset, texts: Dataset):
        if len(regions) == 0 or len(texts) == 0:
            raise ValueError(f"UnpairedRegionDataset: needs samples in both sets, got {len(regions)} regions and "
                             f"{len(texts)} texts")
        self.regions, self.texts = regions, texts

    def __len__(self) -> int:
        return len(self.regions)

    def __getitem__(self, index: int) -> tuple:
        region, text = self.regions[index], self.texts[index % len(self.texts)]
        out = []
        for sample, needs, drop in ((region, has_region, "texts"), (text, has_text, "mask")):
            if isinstance(sample, SkippedSample):
                out.append(sample)
                continue
            if not needs(sample):
                raise ValueError(f"UnpairedRegionDataset: sample {sample.sample_id!r} of the "
                                 f"{'region' if needs is has_region else 'text'} set has no "
                                 f"{'mask' if needs is has_region else 'caption or expression'}")
            if drop == "texts":
                sample = RegionSample(sample.image, sample.gt_mask, [], [], sample.sample_id, sample.source, None)
            else:
                sample = RegionSample(sample.image, None, list(sample.captions), list(sample.expressions),
                                      sample.sample_id, sample.source, sample.category)
            out.append(sample)
        return tuple(out)
