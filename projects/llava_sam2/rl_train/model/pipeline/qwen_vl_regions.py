"""Loop 1's region input for the Qwen-VL family: the region drawn into the image.

Upstream's Qwen-VL family has no region input (its SFT configs leave the visual-prompt data out), so its ``<vp>``
tokens were never trained: a mask-pooled region prompt would be an input its LLM never learned to read. The region is
drawn into a copy of the image instead (``Sa2VAQwenProcessor.draw_region``: its outline in red), which base Qwen-VL
models read as a visual prompt, and the caption question names the outline.

Two callers, one drawing and one question:

* ``describe_masks``' family seam (:func:`describe_drawn_regions`): the partner's greedy caption of a mask (loop 2,
  the held-out cycle tasks);
* loop 1's policy (``grpo.cycle.MaskToCaptionLoop``): each sample's gt region drawn once per step
  (:func:`draw_regions`, kept in ``StepFeatures.drawn_regions``), so that sampling, ``old_logp``, ``ref_logp`` and
  the loss all build the same prompt about the same pixels.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from ..decoding.text_decoding import TextDecoding
from .shared import EncodedImages, PromptRow, RegionAnswer, greedy_answers


def drawn_region_inputs(processor, image, region: Tensor, where: str):
    """The processor's vision inputs (``QwenImageInputs``) of ``image`` with the bool ``[H, W]`` ``region`` drawn in."""
    return processor.preprocess_image(processor.draw_region(image, region), where=where)


@dataclass
class DrawnRegions:
    """Per sample of a step, its gt region drawn into a copy of its image, preprocessed once (loop 1's region input
    on the Qwen-VL family). Row b belongs to sample b; it stands where the shared passes take an ``EncodedImages``
    (``vision_inputs``), with the samples as its images.

    Attributes:
        vision_inputs: per sample ``(pixel_values [P_b, K], image_grid_thw [3])``, None for a sample without a
            region (text only).
        n_image_tokens: per sample the LLM image tokens of its drawn image (0 without a region).
    """

    vision_inputs: list[tuple[Tensor, Tensor] | None]
    n_image_tokens: list[int]

    def n_tiles(self, sample: int) -> int:
        """LLM image tokens of sample ``sample``'s drawn image (the family counts tokens where InternVL counts
        tiles)."""
        return self.n_image_tokens[sample]

    def select(self, rows: Sequence[int]) -> "DrawnRegions":
        return DrawnRegions([self.vision_inputs[r] for r in rows], [self.n_image_tokens[r] for r in rows])

    def caption_prompts(self, processor, samples: Sequence[int], question: str | None = None) -> list[str]:
        """The region-caption user turn of each sample's drawn image (the question :func:`describe_drawn_regions`
        asks)."""
        return [processor.drawn_region_caption_prompt(self.n_tiles(b), question) for b in samples]


def draw_regions(processor, images: Sequence, regions: Sequence[Tensor | None], where: Sequence[str]) -> DrawnRegions:
    """:class:`DrawnRegions` of B samples: ``regions[b]`` (bool ``[H, W]``, or None) drawn into ``images[b]``."""
    inputs = [None if region is None else drawn_region_inputs(processor, image, region, name)
              for image, region, name in zip(images, regions, where)]
    return DrawnRegions([None if x is None else (x.pixel_values, x.image_grid_thw) for x in inputs],
                        [0 if x is None else x.n_tiles for x in inputs])


def describe_drawn_regions(model, processor, encoded: EncodedImages, masks: Sequence, images: Sequence[int],
                           sample_ids: Sequence[str], kept: Sequence[int], *, max_new_tokens: int,
                           question: str | None, decoding: TextDecoding | None,
                           chunk_size: int | None) -> list[RegionAnswer | None]:
    """``describe_masks`` of the Qwen-VL family: each kept mask is drawn into a copy of its image, whose Qwen vision
    inputs join ``encoded`` as extra images (no SAM2 features: a caption decodes no mask), and the drawn image is
    captioned with the outline-naming question."""
    regions = {n: torch.as_tensor(masks[n]).bool().cpu() for n in kept}  # [H, W] each
    drawn = [drawn_region_inputs(processor, encoded.source_images[images[n]], regions[n], sample_ids[n])
             for n in kept]
    first = encoded.num_images
    extended = replace(encoded, image_sizes=encoded.image_sizes + [tuple(x.size) for x in drawn],
                       tile_start=encoded.tile_start + (encoded.tile_start[-1] + np.cumsum(
                           [x.n_tiles for x in drawn], dtype=np.int64)).tolist(),
                       vision_inputs=encoded.vision_inputs + [(x.pixel_values, x.image_grid_thw) for x in drawn])
    rows = [PromptRow(first + j, processor.drawn_region_caption_prompt(x.n_tiles, question))
            for j, x in enumerate(drawn)]
    described: list[RegionAnswer | None] = [None] * len(masks)
    answers = greedy_answers(model, processor, extended, rows, max_new_tokens=max_new_tokens, decoding=decoding,
                             chunk_size=chunk_size)
    for n, answer in zip(kept, answers):
        described[n] = RegionAnswer(answer, regions[n])
    return described
