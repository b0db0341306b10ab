"""The Qwen-VL family's reference greedy decoder: transformers' own ``generate`` on the Qwen-VL model.

Upstream's ``predict_forward`` decodes this way: ``generate`` over ``input_ids`` + ``pixel_values`` +
``image_grid_thw`` (transformers places the vision tower's tokens, builds the 3-D M-RoPE positions and adds Qwen3-VL's
deepstack features), the hidden states of every step kept. ``shared.greedy_answers`` runs it under
``decode_backend='reference'`` (``predict``'s default); the fast backends decode the same prompts on the family seam
(``qwen_vl_prompts.qwen_vl_sample_text``), tested equal to this. The result is a ``Completions`` like every other
decoder's, so answers, ``[SEG]`` states and masks downstream are the shared code's.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..decoding.generation import Completions
from ..decoding.text_decoding import TextDecoding, cut_at_stop_words


def row_vision_inputs(encoded, images: Sequence[int], device: torch.device) -> tuple[Tensor, Tensor]:
    """``pixel_values [ΣP_r, K]`` and ``image_grid_thw [n, 3]`` of prompt rows about ``images`` (row order)."""
    pixels = torch.cat([encoded.vision_inputs[i][0] for i in images]).to(device)
    grids = torch.stack([encoded.vision_inputs[i][1] for i in images]).to(device)
    return pixels, grids


@torch.no_grad()
def qwen_vl_completions(model, encoded, images: Sequence[int], prompt_ids: Tensor, attention: Tensor,
                        decoding: TextDecoding, *, max_new_tokens: int, return_hidden: bool) -> Completions:
    """Greedy completions ``[n, T]`` of left-padded prompts ``[n, L]`` about ``images`` (upstream ``generate``),
    stopped at the stop tokens, cut at the textual stop words; ``hidden [n, T, D]`` is the last hidden state at the
    position whose input is ``ids[:, t]`` (what upstream reads its ``[SEG]`` states from), 0 for the last column."""
    device = model.device
    ids, attention = prompt_ids.to(device), attention.to(device).long()
    pixels, grids = row_vision_inputs(encoded, images, device)
    out = model.model.generate(input_ids=ids, attention_mask=attention,
                               pixel_values=pixels.to(model.visual.dtype), image_grid_thw=grids,
                               max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                               eos_token_id=list(decoding.stop_token_ids), pad_token_id=decoding.pad_token_id,
                               output_hidden_states=return_hidden, output_scores=True, return_dict_in_generate=True)
    new = out.sequences[:, ids.shape[1]:]  # [n, T]
    n, T = new.shape
    is_stop = torch.isin(new, torch.tensor(list(decoding.stop_token_ids), device=device))  # [n, T]
    seen_stop = is_stop.long().cumsum(-1)  # [n, T]
    completion_mask = (seen_stop == 0) | (is_stop & (seen_stop == 1))  # up to and including the first stop
    logp = torch.stack([torch.log_softmax(score.float(), dim=-1) for score in out.scores], dim=1)  # [n, T, V]
    token_logp = logp.gather(-1, new[..., None])[..., 0].masked_fill(~completion_mask, 0.0)  # [n, T]
    hidden = None
    if return_hidden:
        D = out.hidden_states[0][-1].shape[-1]
        fed_back = [step[-1][:, -1] for step in out.hidden_states[1:]]  # T - 1 × [n, D]
        hidden = torch.stack(fed_back + [fed_back[0].new_zeros(n, D) if fed_back else
                                         out.hidden_states[0][-1].new_zeros(n, D)], dim=1)  # [n, T, D]
    completions = Completions(ids=new, completion_mask=completion_mask, is_truncated=seen_stop[:, -1] == 0,
                              token_logp=token_logp, hidden=hidden)
    return cut_at_stop_words(completions, decoding)
