"""Loop 1's region input for the Qwen-VL family: the region drawn into the image (``describe_masks``' family seam).

Upstream's Qwen-VL family has no region input (its SFT configs leave the visual-prompt data out), so its ``<vp>``
tokens were never trained: a mask-pooled region prompt would be an input its LLM never learned to read. The region is
drawn into a copy of the image instead (``Sa2VAQwenProcessor.draw_region``: its outline in red), which base Qwen-VL
models read as a visual prompt, and the caption question names the outline.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from ..decoding.text_decoding import TextDecoding
from .shared import EncodedImages, PromptRow, RegionAnswer, greedy_answers


def describe_drawn_regions(model, processor, encoded: EncodedImages, masks: Sequence, images: Sequence[int],
                           sample_ids: Sequence[str], kept: Sequence[int], *, max_new_tokens: int,
                           question: str | None, decoding: TextDecoding | None,
                           chunk_size: int | None) -> list[RegionAnswer | None]:
    """``describe_masks`` of the Qwen-VL family: each kept mask is drawn into a copy of its image, whose Qwen vision
    inputs join ``encoded`` as extra images (no SAM2 features: a caption decodes no mask), and the drawn image is
    captioned with the outline-naming question."""
    regions = {n: torch.as_tensor(masks[n]).bool().cpu() for n in kept}  # [H, W] each
    drawn = [processor.preprocess_image(processor.draw_region(encoded.source_images[images[n]], regions[n]),
                                        where=sample_ids[n]) for n in kept]
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
