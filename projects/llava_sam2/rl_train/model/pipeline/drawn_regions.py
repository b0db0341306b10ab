"""Loop 1's drawn region input (``describe_masks(..., region_input='drawn')``), for every model family.

Each region is drawn into a copy of its image (``processor.region_outline``, model/text/drawn_region.py) and the copy
is captioned with a question that names the outline; the prompt holds an ordinary image block and no region tokens.
It is the Qwen-VL family's only region input (upstream left its ``<vp>`` tokens untrained: a mask-pooled prompt would
be an input its LLM never learned to read) and an option of the InternVL family, beside its native region tokens.
Loop 1's GRPO step on the Qwen-VL family draws its gt regions with the same function (``qwen_vl_regions.py``).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from ..decoding.text_decoding import TextDecoding, eval_mode
from .shared import EncodedImages, PromptRow, RegionAnswer, greedy_answers, is_qwen_vl_model


def drawn_region_inputs(processor, image, region: Tensor, where: str):
    """The processor's image inputs of ``image`` with the bool ``[H, W]`` ``region`` drawn in."""
    return processor.preprocess_image(processor.region_outline.draw(image, region), where=where)


def many_drawn_region_inputs(processor, images: Sequence, regions: Sequence[Tensor], wheres: Sequence[str]) -> list:
    """:func:`drawn_region_inputs` of each (image, region, where), on a few threads: the drawing and the image
    processor's resize / normalise are numpy and PIL work that releases the GIL, ~0.2-0.3 s an 896 px copy on one
    core, and loop 2's partner draws one copy per rollout (64 at B = G = 8). Same inputs, in order."""
    jobs = list(zip(images, regions, wheres))
    workers = min(len(jobs), 8, os.cpu_count() or 1)
    if workers <= 1:
        return [drawn_region_inputs(processor, *job) for job in jobs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: drawn_region_inputs(processor, *job), jobs))


def describe_drawn_regions(model, processor, encoded: EncodedImages, masks: Sequence, images: Sequence[int],
                           sample_ids: Sequence[str], kept: Sequence[int], *, max_new_tokens: int,
                           question: str | None, decoding: TextDecoding | None, tile_embeds: Tensor | None,
                           chunk_size: int | None) -> list[RegionAnswer | None]:
    """``describe_masks`` with the drawn input: each kept mask is drawn into a copy of its image, the copies join
    ``encoded`` as extra images (vision inputs only: a caption decodes no mask, so they get no SAM2 features), and
    each copy is captioned with the outline-naming question (``question`` must name the outline itself)."""
    if encoded.source_images is None:
        raise ValueError("describe_masks(region_input='drawn') needs the source images: encode them with "
                         "encode_images (it keeps them in EncodedImages.source_images)")
    regions = {n: torch.as_tensor(np.asarray(masks[n])).bool().cpu() for n in kept}  # [H, W] each
    drawn = many_drawn_region_inputs(processor, [encoded.source_images[images[n]] for n in kept],
                                     [regions[n] for n in kept], [sample_ids[n] for n in kept])
    described: list[RegionAnswer | None] = [None] * len(masks)
    if not drawn:
        return described
    first = encoded.num_images
    extended = replace(encoded, image_sizes=encoded.image_sizes + [tuple(x.size) for x in drawn],
                       tile_start=encoded.tile_start + (encoded.tile_start[-1] + np.cumsum(
                           [x.n_tiles for x in drawn], dtype=np.int64)).tolist())
    if is_qwen_vl_model(model):
        extended.vision_inputs = encoded.vision_inputs + [(x.pixel_values, x.image_grid_thw) for x in drawn]
    else:
        with eval_mode(model), torch.no_grad():
            vit_tokens = model.encode_vision(torch.cat([x.pixel_values for x in drawn]).to(model.device))
            extended.vit_tokens = torch.cat([encoded.vit_tokens, vit_tokens])  # [n_tiles_total + drawn tiles, t, 4C]
            if tile_embeds is not None:  # the caller's projection (its weights) of the original images, extended
                tile_embeds = torch.cat([tile_embeds, model.project_vision(vit_tokens)])
    outline = processor.region_outline
    rows = [PromptRow(first + j, outline.caption_prompt(processor, x.n_tiles, question)) for j, x in enumerate(drawn)]
    answers = greedy_answers(model, processor, extended, rows, max_new_tokens=max_new_tokens, decoding=decoding,
                             tile_embeds=tile_embeds, chunk_size=chunk_size)
    for n, answer in zip(kept, answers):
        described[n] = RegionAnswer(answer, regions[n], is_drawn=True)
    return described
