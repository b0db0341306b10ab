"""Teacher-forced referring segmentation that keeps what ``predict`` throws away: mask logits and SAM2's IoU head.

For every row (image, question template, expression) the user turn is ``Sa2VAProcessor.segment_prompt`` and the
assistant answer is teacher-forced to ``SEG_ANSWER`` ("Sure, [SEG].", one of Sa2VA's five RES answers, the same
fixed answer as the GRPO caption->mask loop, grpo/cycle.py), through the shared model pipeline
(``model.pipeline.shared``: ``encode_images``, ``forced_answer_masks``): the final-norm hidden state at
the answer's ``[SEG]`` goes through ``text_hidden_fcs`` and the SAM2 decoder (multimask, best by predicted IoU, as
upstream). A forced
answer means every row gets exactly one mask, so the quality data never has "missing" masks from a model that
failed to emit ``[SEG]``; the mask is the one greedy decoding would give whenever the model answers with this
text. Binary masks follow the released chain (bilinear h -> S_sam -> (H, W), logit > 0).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..model.text.constants import SEG_TOKEN
from ..model.decoding.text_decoding import eval_mode
from ..model.network.grounding import upsample_logits
from ..model.pipeline.shared import SEG_ANSWER, encode_images, forced_answer_masks, seg_answer_ids


@dataclass
class SegmentRows:
    """N segmentation requests over I images: ``image_index [N]`` (row of ``images``), expressions, questions."""

    image_index: list[int]
    expressions: list[str]
    questions: list[str | None]

    def __post_init__(self) -> None:
        if not len(self.image_index) == len(self.expressions) == len(self.questions):
            raise ValueError(f"SegmentRows: {len(self.image_index)} image indices, {len(self.expressions)} "
                             f"expressions and {len(self.questions)} questions; pass one of each per row")


@dataclass
class SegmentOutput:
    """Per row: ``low_res_logits [N, h, w]`` float32 (chosen multimask output), ``pred_iou [N]`` (SAM2 IoU head of
    that output, sigmoid), ``pred_masks`` N bool ``[H, W]`` numpy at image size; per image: ``image_features
    [I, D]`` (mean of the projected ViT tokens over tiles and tokens, the prompt policy's state)."""

    low_res_logits: Tensor
    pred_iou: Tensor
    pred_masks: list[np.ndarray]
    image_features: Tensor


def answer_token_ids(tokenizer, answer: str = SEG_ANSWER) -> tuple[Tensor, int]:
    """``(ids [A], seg_index)``: the teacher-forced answer and the position of its single ``[SEG]``, which must be
    followed by a token (greedy decoding gives no mask for a final ``[SEG]``)."""
    ids, seg_index = seg_answer_ids(tokenizer, answer, tokenizer.convert_tokens_to_ids(SEG_TOKEN), where="answer")
    if seg_index == len(ids) - 1:
        raise ValueError(f"answer {answer!r} must hold exactly one {SEG_TOKEN} followed by at least one token "
                         "(e.g. 'Sure, [SEG].')")
    return ids, seg_index


def mean_tile_tokens(tiles: Tensor, n_tiles: Sequence[int]) -> Tensor:
    """Mean projected ViT token per image: tiles ``[sum n_i, t, D]`` -> ``[I, D]`` (the prompt policy's state)."""
    starts = np.cumsum([0] + list(n_tiles))
    return torch.stack([tiles[a:b].float().mean(dim=(0, 1)) for a, b in zip(starts[:-1], starts[1:])])


@torch.no_grad()
def segment_rows(model, processor, images: Sequence, rows: SegmentRows, *, answer: str = SEG_ANSWER,
                 chunk_size: int = 32) -> SegmentOutput:
    """Run the teacher-forced RES pass for every row (see module doc); ``chunk_size`` rows per LLM call."""
    if len(images) == 0 or len(rows.image_index) == 0:
        raise ValueError("segment_rows: nothing to segment (no images or no rows)")
    bad = [i for i in rows.image_index if not 0 <= i < len(images)]
    if bad:
        raise ValueError(f"segment_rows: image_index {bad[0]} out of range for {len(images)} images")
    encoded = encode_images(model, processor, images, [f"image {i}" for i in range(len(images))])
    n_tiles = [encoded.n_tiles(i) for i in range(encoded.num_images)]
    answer_ids, seg_index = answer_token_ids(processor.tokenizer, answer)
    device = model.device
    logits, ious = [], []
    with eval_mode(model):
        tiles = model.project_vision(encoded.vit_tokens)  # [sum n_i, t, D]
        feats = mean_tile_tokens(tiles, n_tiles)  # [I, D]
        for r0 in range(0, len(rows.image_index), chunk_size):
            idx = rows.image_index[r0:r0 + chunk_size]
            prompts = [processor.segment_prompt(n_tiles[i], e, q) for i, e, q in
                       zip(idx, rows.expressions[r0:r0 + chunk_size], rows.questions[r0:r0 + chunk_size])]
            ids, attention = processor.tokenize_prompts(prompts)  # [n, L] left padded
            out = forced_answer_masks(model, encoded, tiles, ids.to(device), attention.to(device), idx,
                                      answer_ids.to(device), seg_index)
            logits.append(out.best_logits.float().cpu())  # [n, h, w]
            ious.append(out.iou_scores.gather(1, out.best_index[:, None])[:, 0].float().cpu())  # [n]
    low_res = torch.cat(logits)  # [N, h, w]
    masks: list[np.ndarray | None] = [None] * len(rows.image_index)
    index = torch.tensor(rows.image_index)
    for i, size in enumerate(encoded.image_sizes):  # one upsampling call per image (its rows share the output size)
        picked = torch.nonzero(index == i).flatten()
        if len(picked):
            up = upsample_logits(low_res[picked], size, model.config.sam_image_size) > 0  # [n_i, H, W]
            for n, mask in zip(picked.tolist(), up.numpy()):
                masks[n] = mask
    return SegmentOutput(low_res_logits=low_res, pred_iou=torch.cat(ious), pred_masks=masks,
                         image_features=feats.cpu())
