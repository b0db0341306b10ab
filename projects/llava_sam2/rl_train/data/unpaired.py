"""Unpaired region data for the cycle loops: regions without text for loop 1, texts without masks for loop 2.

Cycle RL's use case is a domain with no paired (caption, mask) data: loop 1 (mask -> caption -> mask') needs only
regions of images (e.g. automatic masks), loop 2 (caption -> mask -> caption') only texts about other images.
``UnpairedRegionDataset`` zips two region datasets so that every item holds one sample of each: item ``i`` is
``(regions[i], texts[i % len(texts)])``; ``region_collate`` lays the pairs out flat, so a batch of B items carries
B region-only and B text-only samples and each loop gets B prompts, as with paired data.

The same zip serves video: two datasets of ``VideoRegionSample`` (e.g. SA-V masklets without text for loop 1, MeViS
expressions with their masklets dropped for loop 2) give region-only clips and text-only clips; the region of a clip
is its masklet ``gt_masks``.
"""
from __future__ import annotations

from dataclasses import replace

from torch.utils.data import Dataset

from .bad_samples import SkippedSample
from .types import RegionSample, VideoRegionSample

# the field holding a sample's region: an image's mask, a clip's masklet
REGION_FIELD = {RegionSample: "gt_mask", VideoRegionSample: "gt_masks"}


def _region_field(sample) -> str:
    if type(sample) not in REGION_FIELD:
        raise TypeError(f"UnpairedRegionDataset: sample {getattr(sample, 'sample_id', sample)!r} is a "
                        f"{type(sample).__name__}; the datasets must yield RegionSample or VideoRegionSample")
    return REGION_FIELD[type(sample)]


def has_region(sample: RegionSample | VideoRegionSample) -> bool:
    """The sample carries a region mask, or a masklet for a clip (loop 1 can use it)."""
    return getattr(sample, _region_field(sample)) is not None


def has_text(sample: RegionSample) -> bool:
    """The sample carries a caption or a referring expression (loop 2 can ground it)."""
    return any(isinstance(t, str) and t.strip() for t in [*sample.captions, *sample.expressions])


class UnpairedRegionDataset(Dataset):
    """Items ``(region sample, text sample)`` from two region datasets of disjoint images (or clips).

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
                sample = replace(sample, captions=[], expressions=[], category=None)
            else:
                sample = replace(sample, **{_region_field(sample): None}, captions=list(sample.captions),
                                 expressions=list(sample.expressions))
            out.append(sample)
        return tuple(out)
