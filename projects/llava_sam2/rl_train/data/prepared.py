"""The host half of an image step's encode, done where the batch is built (``data.collate.PreprocessingCollate``).

A GRPO step encodes its images in two parts: the processor's preprocessing on the host (InternVL dynamic tiles,
the SAM2 input, normalisation; each sample's gt mask as a bool tensor and its region cells) and the frozen
encoders on the device. The host part needs nothing from the model, so a training run does it in its DataLoader
workers, overlapped with the previous step, and the step only copies tensors to the device
(``grpo.features.encode_step`` uses a batch's ``prepared`` when present and computes it itself otherwise, with the
same functions, so the features are equal bit for bit).

The processor stays the one place that defines the preprocessing: this module only calls it. A sample whose
preparation raises a ``ValueError`` or ``TypeError`` (a bad image, a mask of the wrong size, a region that hits no
grid point under ``empty_region='raise'``) is left unprepared, so the step meets the same error, naming the sample,
where it always did.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .types import RegionSample


@dataclass(frozen=True)
class PreparedSample:
    """One image sample's host inputs.

    Attributes:
        image_inputs: the processor's ``preprocess_image`` of the sample's image (one object per distinct image of
            the batch, shared by the samples that hold the same PIL object).
        gt_mask: bool ``[H, W]`` tensor of the region (``gt_mask_tensor``), None for a text-only sample.
        region_cells: bool ``[g, g]`` region cells of ``gt_mask`` (the processor's ``region_cells``), None without
            a mask or when the batch was prepared without cells.
    """

    image_inputs: Any
    gt_mask: Tensor | None
    region_cells: Tensor | None


@dataclass(frozen=True)
class PreparedBatch:
    """A batch's host inputs (``RegionBatch.prepared``).

    Attributes:
        settings: the ``preprocessing_settings`` of the processor that made them; a step whose processor differs
            refuses them.
        samples: one entry per sample of the batch, None where the step prepares the sample itself.
        with_region_cells: whether the region cells were computed.
        sample_ids: the ids of the samples they were made for, in order (a batch changed after the collate no
            longer matches them, and the step refuses them).
    """

    settings: Any
    samples: list[PreparedSample | None]
    with_region_cells: bool
    sample_ids: list[str]


def gt_mask_tensor(sample: RegionSample, size: tuple[int, int]) -> Tensor | None:
    """The sample's region as a bool ``[H, W]`` tensor (nonzero = inside); None for a text-only sample. Raises,
    naming the sample, when the mask is not at the image's size ``(H, W)``."""
    if sample.gt_mask is None:  # a text-only sample of unpaired data
        return None
    gt_mask = torch.as_tensor(np.asarray(sample.gt_mask))
    if gt_mask.dim() != 2 or tuple(gt_mask.shape) != tuple(size):
        raise ValueError(f"sample {sample.sample_id!r}: gt_mask has shape {tuple(gt_mask.shape)} but the image is "
                         f"(H, W) = {tuple(size)}; the region mask must be at image resolution.")
    return gt_mask.bool() if gt_mask.dtype == torch.bool else gt_mask > 0


def prepare_sample(processor, sample: RegionSample, image_inputs: Any, *, region_cells: bool) -> PreparedSample:
    """``sample``'s mask and region cells for its preprocessed image ``image_inputs`` (the functions the step
    runs; errors name the sample)."""
    gt_mask = gt_mask_tensor(sample, image_inputs.size)
    cells = None
    if region_cells and gt_mask is not None:
        cells = processor.region_cells(gt_mask, sample_id=sample.sample_id, size=image_inputs.size)
    return PreparedSample(image_inputs, gt_mask, cells)


def prepare_batch(processor, batch: Sequence, *, region_cells: bool = True) -> PreparedBatch | None:
    """The host inputs of an image batch, one processor call per distinct image (PIL object); None for a processor
    without ``preprocessing_settings`` (its inputs are left to the step) or a batch that is not all image samples."""
    settings = getattr(processor, "preprocessing_settings", None)
    if settings is None or not batch or not all(isinstance(s, RegionSample) for s in batch):
        return None
    by_image: dict[int, Any] = {}  # id(PIL image) -> its ImageInputs, or None when preprocessing it raised
    prepared: list[PreparedSample | None] = []
    for sample in batch:
        key = id(sample.image)
        if key not in by_image:
            try:
                by_image[key] = processor.preprocess_image(sample.image, where=sample.sample_id)
            except (TypeError, ValueError):  # the step raises it again, naming the sample
                by_image[key] = None
        try:
            prepared.append(None if by_image[key] is None else
                            prepare_sample(processor, sample, by_image[key], region_cells=region_cells))
        except (TypeError, ValueError):
            prepared.append(None)
    return PreparedBatch(settings, prepared, region_cells, [s.sample_id for s in batch])
