"""StepFeatures: what the frozen encoders produce for one GRPO step, computed once per image (DESIGN §3.1).

``encode_step`` runs InternViT (+ pixel shuffle) and the SAM2 image encoder exactly once per distinct image of
the batch, without grad (``model.pipeline.shared.encode_images``), and keeps the results for every pass of the step:
both loops, the sampling policy, the EMA partner and the reference. ``mlp1`` is trainable and differs between
those weight sets, so it is *not* cached: each pass re-projects ``vit_tokens`` with the weights in effect
(``model.project_vision``).

An image shared by several samples (several regions of one picture) is encoded once when the samples hold the
same PIL object; equal pixels in distinct objects are encoded separately (no hashing of pixels).

Unpaired data: a sample may carry a region and no text (loop 1 only) or a text and no mask (``gt_mask`` None, loop 2
only). ``loop_rows`` names the samples each loop can use and ``StepFeatures.select`` gives a loop its rows, sharing
the encoded images.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor

from ..model.pipeline.shared import EncodedImages, encode_images


@dataclass
class StepFeatures(EncodedImages):
    """The step's I distinct images, encoded (``EncodedImages``: ``vit_tokens``, ``grounding``, ``image_sizes``,
    ``tile_start``), plus the per-sample targets of its B samples.

    Attributes:
        samples: the B ``RegionSample`` of the step.
        image_index: ``[B]`` long (model device), row of each sample's image in the per-image tensors.
        gt_masks: B bool ``[H, W]`` CPU tensors, the region of each sample (None for a text-only sample).
        region_cells: ``[B, g, g]`` bool region-token cells of each gt_mask (CPU; all False for a text-only
            sample), or None when loop 1 is off.
        prompt_texts: B texts loop 2 grounds (first caption, else first expression; "" for a region-only sample),
            or None when loop 2 is off.
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

    def select(self, rows: Sequence[int]) -> "StepFeatures":
        """The features of samples ``rows`` only (the encoded images are shared, not copied); self for all rows."""
        rows = [int(r) for r in rows]
        if rows == list(range(self.num_samples)):
            return self
        return replace(self, samples=[self.samples[r] for r in rows], image_index=self.image_index[rows],
                       gt_masks=[self.gt_masks[r] for r in rows],
                       region_cells=None if self.region_cells is None else self.region_cells[rows],
                       prompt_texts=None if self.prompt_texts is None else [self.prompt_texts[r] for r in rows],
                       references=[self.references[r] for r in rows])


# loop name -> does a sample carry what that loop needs (loop 1: a region mask; loop 2: a text to ground)
LOOP_NEEDS = {"mask_to_caption": lambda s: s.gt_mask is not None,
              "caption_to_mask": lambda s: bool(_reference_texts(s))}


def loop_rows(features: StepFeatures, loop_name: str) -> list[int]:
    """The samples of the step that loop ``loop_name`` can use; raises when there is none."""
    rows = [b for b, sample in enumerate(features.samples) if LOOP_NEEDS[loop_name](sample)]
    if not rows:
        what = "a region mask" if loop_name == "mask_to_caption" else "a caption or an expression to ground"
        raise ValueError(f"{loop_name} loop: no sample of the step has {what} (e.g. {features.sample_ids[0]!r}); "
                         f"give the RL data such samples or set {loop_name}_weight=0.")
    return rows


def _reference_texts(sample) -> list[str]:
    return [t for t in (list(sample.captions) or list(sample.expressions)) if isinstance(t, str) and t.strip()]


def _gt_mask(sample, size: tuple[int, int]) -> Tensor | None:
    if sample.gt_mask is None:  # a text-only sample of unpaired data
        return None
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
        use_prompt_texts: pick the text loop 2 grounds ("" for a sample with neither caption nor expression, which
            ``loop_rows`` leaves out of loop 2).
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
        cells = {b: processor.region_cells(m, sample_id=s.sample_id, size=sizes[i])
                 for b, (s, m, i) in enumerate(zip(batch, gt_masks, image_index)) if m is not None}  # b -> [g, g]
        blank = torch.zeros_like(next(iter(cells.values()))) if cells else None
        region_cells = None if blank is None else torch.stack(
            [cells.get(b, blank) for b in range(len(batch))])  # [B, g, g]
    references = [_reference_texts(s) for s in batch]
    prompt_texts = None
    if use_prompt_texts:
        prompt_texts = [refs[0] if refs else "" for refs in references]
    return StepFeatures(
        **{f.name: getattr(encoded, f.name) for f in fields(EncodedImages)}, samples=list(batch),
        image_index=torch.tensor(image_index, dtype=torch.long, device=model.device), gt_masks=gt_masks,
        region_cells=region_cells, prompt_texts=prompt_texts, references=references,
    )
