"""Loop 1's region input for the Qwen-VL family in the GRPO step: each sample's gt region drawn into its image once.

Upstream's Qwen-VL family has no region input (its SFT configs leave the visual-prompt data out), so its ``<vp>``
tokens were never trained: a mask-pooled region prompt would be an input its LLM never learned to read. The region is
drawn into a copy of the image instead (``processor.region_outline``, model/text/drawn_region.py: its outline in red),
which base Qwen-VL models read as a visual prompt, and the caption question names the outline.

Two callers, one drawing and one question:

* ``describe_masks``' drawn input (``drawn_regions.describe_drawn_regions``): the partner's greedy caption of a mask
  (loop 2, the held-out cycle tasks);
* loop 1's policy (``grpo.cycle.MaskToCaptionLoop``): each sample's gt region drawn once per step
  (:func:`draw_regions`, kept in ``StepFeatures.drawn_regions``), so that sampling, ``old_logp``, ``ref_logp`` and
  the loss all build the same prompt about the same pixels.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from .drawn_regions import many_drawn_region_inputs


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
        """The region-caption user turn of each sample's drawn image (the question ``describe_drawn_regions``
        asks)."""
        return [processor.region_outline.caption_prompt(processor, self.n_tiles(b), question) for b in samples]


def draw_regions(processor, images: Sequence, regions: Sequence[Tensor | None], where: Sequence[str]) -> DrawnRegions:
    """:class:`DrawnRegions` of B samples: ``regions[b]`` (bool ``[H, W]``, or None) drawn into ``images[b]``."""
    drawn = [b for b, region in enumerate(regions) if region is not None]
    made = iter(many_drawn_region_inputs(processor, [images[b] for b in drawn], [regions[b] for b in drawn],
                                         [where[b] for b in drawn]))
    inputs = [None if region is None else next(made) for region in regions]
    return DrawnRegions([None if x is None else (x.pixel_values, x.image_grid_thw) for x in inputs],
                        [0 if x is None else x.n_tiles for x in inputs])
