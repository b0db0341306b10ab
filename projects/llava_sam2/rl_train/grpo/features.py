"""StepFeatures: what the frozen encoders produce for one GRPO step, computed once per image (DESIGN §3.1).

``encode_step`` runs InternViT (+ pixel shuffle) and the SAM2 image encoder exactly once per distinct image of
the batch, without grad (``model.pipeline.encode_images``), and keeps the results for every pass of the step:
both loops, the sampling policy, the EMA partner and the reference. ``mlp1`` is trainable and differs between
those weight sets, so it is *not* cached: each pass re-projects ``vit_tokens`` with the weights in effect
(``model.project_vision``).

An image shared by several samples (several regions of one picture) is encoded once when the samples hold the
same PIL object; equal pixels in distinct objects are encoded separately (no hashing of pixels).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from ..model.pipeline import EncodedImages, encode_images


@dataclass
class StepFeatures(EncodedImages):
    """The step's I distinct images, encoded (``EncodedImages``: ``vit_tokens``, ``grounding``, ``image_sizes``,
    ``tile_start``), plus the per-sample targets of its B samples.

    Attributes:
        samples: the B ``RegionSample`` of the step.
        image_index: ``[B]`` long (model device), row of each sample's image in the per-image tensors.
        gt_masks: B bool ``[H, W]`` CPU tensors, the region of each sample.
        region_cells: ``[B, g, g]`` bool region-token cells of each gt_mask (CPU), or None when loop 1 is off.
        prompt_texts: B texts loop 2 grounds (first caption, else first expression), or None when loop 2 is off.
        references: B lists of reference texts for caption rewards (captions, else expressions).
    """

    samples: list
    image_index: Tensor
    gt_masks: list[Tensor]
    region_cells: Tensor | None
    prompt_texts: list[str] | None
    references: list[list[str]]

    @property
    def num_samples(self) -> int:
        """B."""
        return len(self.samples)

    @property
    def sample_ids(self) -> list[str]:
        return [s.sample_id for s in self.samples]

    def image_of(self, sample: int) -> int:
        return int(self.image_index[sample])


def _reference_texts(sample) -> list[str]:
    return [t for t in (list(sample.captions) or list(sample.expressions)) if isinstance(t, str) and t.strip()]


def _gt_mask(sample, size: tuple[int, int]) -> Tensor:
    gt_mask = torch.as_tensor(np.asarray(sample.gt_mask))
    if gt_mask.dim() != 2 or tuple(gt_mask.shape) != tuple(size):
        raise ValueError(f"sample {sample.sample_id!r}: gt_mask has shape {tuple(gt_mask.shape)} but the image is "
                         f"(H, W) = {tuple(size)}; the region mask must be at image resolution.")
    return gt_mask.bool() if gt_mask.dtype == torch.bool else gt_mask > 0


@torch.no_grad()
def encode_step(model, processor, batch: Sequence, *, use_region_cells: bool, use_prompt_texts: bool
                ) -> StepFeatures:
    """Preprocess the batch and run the frozen encoders once per distinct image (one batched call each).

    Args:
        model: the ``Sa2VAModel``; processor: its ``Sa2VAProcessor``.
        batch: B ``RegionSample``.
        use_region_cells: compute region cells of every gt_mask (loop 1; the processor's empty-region policy
            applies, so a region that hits no grid point raises under ``empty_region='raise'``).
        use_prompt_texts: pick the text loop 2 grounds; a sample with neither caption nor expression raises.
    """
    if isinstance(batch, (str, bytes)) or len(batch) == 0:
        raise ValueError("CycleGRPO.encode: got an empty batch; the dataloader must yield a non-empty list of "
                         "RegionSample (data.collate.region_collate).")
    rows: dict[int, int] = {}  # id(PIL image) -> image row
    images, names, image_index = [], [], []
    for sample in batch:
        if id(sample.image) not in rows:
            rows[id(sample.image)] = len(images)
            images.append(sample.image)
            names.append(sample.sample_id)
        image_index.append(rows[id(sample.image)])
    encoded = encode_images(model, processor, images, names)
    sizes = encoded.image_sizes
    gt_masks = [_gt_mask(s, sizes[i]) for s, i in zip(batch, image_index)]
    region_cells = None
    if use_region_cells:
        region_cells = torch.stack([processor.region_cells(m, sample_id=s.sample_id, size=sizes[i])
                                    for s, m, i in zip(batch, gt_masks, image_index)])  # [B, g, g]
    references = [_reference_texts(s) for s in batch]
    prompt_texts = None
    if use_prompt_texts:
        missing = [s.sample_id for s, refs in zip(batch, references) if not refs]
        if missing:
            raise ValueError(f"caption_to_mask loop: sample {missing[0]!r} has neither a caption nor an expression "
                             "to ground; drop text-less samples from the RL data or set caption_to_mask_weight=0.")
        prompt_texts = [refs[0] for refs in references]
    return StepFeatures(
        **{f.name: getattr(encoded, f.name) for f in fields(EncodedImages)}, samples=list(batch),
        image_index=torch.tensor(image_index, dtype=torch.long, device=model.device), gt_masks=gt_masks,
        region_cells=region_cells, prompt_texts=prompt_texts, references=references,
    )
