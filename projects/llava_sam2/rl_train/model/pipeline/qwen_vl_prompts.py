"""The Qwen-VL family's prompt rows for the shared teacher-forced passes: embeddings, M-RoPE positions, deepstack.

The shared passes (grouped scoring of the GRPO loss, forced answers) run the LLM's decoder layers on
``inputs_embeds``. A Qwen-VL prompt row needs three things from transformers' own Qwen-VL code for that:

* its embeddings, the ``<|image_pad|>`` rows filled by the vision tower (``get_image_features``);
* its 3-D M-RoPE positions (``get_rope_index`` over the left-padded batch and the images' grids); text after the
  prompt goes on from the row's largest position + 1 on all three axes (``generation.continuation_positions``);
* Qwen3-VL only: the deepstack features, added to the image rows' states after each of the first LLM layers.

:func:`qwen_vl_prompt_inputs` is the one place that builds them; the passes take the positions and the per-layer
additions as given: ``grouped_scoring.grouped_completion_logprobs`` (the GRPO loss's teacher-forced log-probs),
:func:`qwen_vl_answer_states` (a forced answer's ``[SEG]`` state, ``shared.forced_answer_seg_prompts``), the fast
decoder ``fast_generation.fast_sample_completions`` and the reference decoder ``generation.sample_completions`` (both
with ``prompt_positions`` + :meth:`QwenPromptInputs.prefill_kwargs`; :func:`qwen_vl_sample_text` picks one). The
vision tower runs once per distinct image of a call, whatever the number of rows about it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..decoding.fast_generation import decode_completions
from ..decoding.generation import Completions, sample_completions
from ..decoding.grouped_scoring import grouped_hidden
from ..decoding.text_decoding import TextDecoding, group_chunks, joined_completions
from .qwen_vl_decode import row_vision_inputs


@dataclass
class QwenPromptInputs:
    """A left-padded batch of Qwen-VL prompt rows as the LLM's decoder layers take it.

    Attributes:
        embeds: ``[B, L, D]`` token embeddings, the image rows replaced by the vision tower's tokens.
        positions: ``[3, B, L]`` M-RoPE positions (temporal, height, width).
        layer_additions: per LLM layer (the first few; empty for Qwen2.5-VL) ``[B, L, D]``: the deepstack features
            at the image rows, 0 elsewhere.
        image_rows: ``[B, L]`` bool, the ``<|image_pad|>`` positions.
    """

    embeds: Tensor
    positions: Tensor
    layer_additions: list[Tensor]
    image_rows: Tensor

    def prefill_kwargs(self) -> dict:
        """The deepstack features as transformers' Qwen3-VL text model takes them at a prefill (image positions +
        per-layer features of those positions); empty for Qwen2.5-VL."""
        if not self.layer_additions:
            return {}
        return {"visual_pos_masks": self.image_rows,
                "deepstack_visual_embeds": [layer[self.image_rows] for layer in self.layer_additions]}

    def repeat_rows(self, num_generations: int) -> "QwenPromptInputs":
        """Each prompt row repeated ``num_generations`` times (row ``b·G + g`` is prompt b), as a decoder that
        samples G completions per prompt takes them."""
        G = num_generations
        return QwenPromptInputs(self.embeds.repeat_interleave(G, 0), self.positions.repeat_interleave(G, 1),
                                [layer.repeat_interleave(G, 0) for layer in self.layer_additions],
                                self.image_rows.repeat_interleave(G, 0))


def qwen_vl_prompt_inputs(model, encoded, images: Sequence[int], prompt_ids: Tensor,
                          attention: Tensor) -> QwenPromptInputs:
    """:class:`QwenPromptInputs` of left-padded prompts ``[B, L]`` about ``images`` (rows of ``encoded``)."""
    qwen = model.hf_model.model  # Qwen2_5_VLModel / Qwen3VLModel: vision tower, text model, get_rope_index
    device = model.device
    ids, attention = prompt_ids.to(device), attention.to(device).long()
    distinct = list(dict.fromkeys(images))  # the tower runs once per distinct image, not once per row
    pixels, grids = row_vision_inputs(encoded, distinct, device)  # [ΣP, K], [U, 3]
    is_frozen = not any(p.requires_grad for p in model.visual.parameters())
    with torch.set_grad_enabled(torch.is_grad_enabled() and not is_frozen):  # a frozen tower keeps no activations
        features = qwen.get_image_features(pixels.to(model.visual.dtype), grids)
    # Qwen3-VL returns (per-image tokens, per-layer deepstack features); Qwen2.5-VL the per-image tokens alone
    image_tokens, deepstack = features if model.config.family == "qwen3_vl" else (features, [])
    sizes = [len(tokens) for tokens in image_tokens]
    order = [distinct.index(image) for image in images]

    def per_row(per_image: Sequence[Tensor]) -> Tensor:  # the distinct images' blocks in row order, joined
        return torch.cat([per_image[u] for u in order])

    embeds = model.get_input_embeddings()(ids)  # [B, L, D]
    image_rows = ids == model.image_token_id  # [B, L]
    deepstack = [per_row(layer.split(sizes)) for layer in deepstack]  # per layer [n_image_rows, D]
    image_tokens = per_row(image_tokens).to(embeds.dtype)  # [n_image_rows, D]
    if image_tokens.shape[0] != int(image_rows.sum()):
        raise ValueError(f"qwen_vl_prompt_inputs: {int(image_rows.sum())} {model.image_token_id=} tokens in the "
                         f"prompts but the images give {image_tokens.shape[0]}; expand each image block to its grid")
    embeds = embeds.masked_scatter(image_rows[..., None], image_tokens)
    row_grids = grids[order]  # [B, 3]
    positions, _ = qwen.get_rope_index(input_ids=ids, image_grid_thw=row_grids, attention_mask=attention)  # [3, B, L]
    additions = [embeds.new_zeros(embeds.shape).masked_scatter(image_rows[..., None], layer.to(embeds.dtype))
                 for layer in deepstack]  # per layer [B, L, D]
    return QwenPromptInputs(embeds, positions, additions, image_rows)


def qwen_vl_answer_states(model, encoded, images: Sequence[int], prompt_ids: Tensor, attention: Tensor,
                          answer_ids: Tensor) -> Tensor:
    """The family's ``[SEG]``-reading states ``[n, A, D]`` (``model.seg_state_after_final_norm``: after the final
    norm, or the last layer's output before it) at the positions whose inputs are the teacher-forced
    ``answer_ids [n, A]`` after left-padded prompts ``[n, L]`` about ``images``: one grouped pass (a group of one)
    with the family's positions and deepstack additions; carries grad."""
    inputs = qwen_vl_prompt_inputs(model, encoded, images, prompt_ids, attention)
    answer_ids = answer_ids.to(inputs.embeds.device)
    _, states = grouped_hidden(model.hf_model, inputs.embeds, attention.to(inputs.embeds.device).bool(), answer_ids,
                               torch.ones_like(answer_ids, dtype=torch.bool), 1, inputs.positions,
                               inputs.layer_additions, final_norm=model.seg_state_after_final_norm)
    return states  # [n, A, D]


@torch.no_grad()
def qwen_vl_sample_text(model, encoded, images: Sequence[int], prompt_ids: Tensor, attention: Tensor,
                        decoding: TextDecoding, *, num_generations: int, max_new_tokens: int, do_sample: bool,
                        temperature: float = 1.0, top_p: float = 1.0, chunk_size: int | None = None,
                        generator: torch.Generator | None = None, return_hidden: bool = False) -> Completions:
    """``text_decoding.sample_text`` of the family: G completions of each left-padded prompt ``[b, L]`` about
    ``images`` (rows of ``encoded``), row ``r·G + g`` the g-th of prompt r, decoded by ``decoding.decode_backend`` on
    the seam's inputs (M-RoPE positions, Qwen3-VL's deepstack at the prefill), at most ``chunk_size`` rows (whole
    groups) per call, cut at the textual stop words and padded to the bucketed length
    (``text_decoding.joined_completions``). ``token_logp`` is at ``temperature``, as the GRPO loss scores it.

    The fast backends prefill each prompt once and decode its G rows from a static cache
    (``fast_generation.fast_sample_completions`` with ``prompt_positions``); ``'reference'`` prefills each prompt G
    times (``generation.sample_completions``). ``return_hidden`` keeps the fed-back tokens' ``[SEG]``-reading states
    (``model.seg_state_after_final_norm``: after the final norm, or the last layer's output before it; fast backends
    only, the reference decoder keeps the final-norm ones)."""
    G = num_generations
    parts = []
    common = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, do_sample=do_sample,
                  stop_token_ids=list(decoding.stop_token_ids), pad_token_id=decoding.pad_token_id,
                  generator=generator)
    for b0, b1 in group_chunks(prompt_ids.shape[0], G, chunk_size):
        inputs = qwen_vl_prompt_inputs(model, encoded, images[b0:b1], prompt_ids[b0:b1], attention[b0:b1])
        rows = attention[b0:b1].to(inputs.embeds.device)  # [b, L]
        if decoding.decode_backend == "reference":
            inputs = inputs.repeat_rows(G)
            parts.append(sample_completions(model.hf_model, inputs.embeds, rows.repeat_interleave(G, 0),
                                            prompt_positions=inputs.positions, prefill_kwargs=inputs.prefill_kwargs(),
                                            return_hidden=return_hidden, **common))
            continue
        parts.append(decode_completions(model.hf_model, inputs.embeds, rows, decode_backend=decoding.decode_backend,
                                        num_generations=G, prompt_positions=inputs.positions,
                                        prefill_kwargs=inputs.prefill_kwargs(), return_hidden=return_hidden,
                                        hidden_after_norm=model.seg_state_after_final_norm, **common))
    return joined_completions(parts, decoding, max_new_tokens)
