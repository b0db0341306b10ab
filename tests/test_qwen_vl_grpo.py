"""The GRPO step's shared passes on the Qwen-VL family: the family seam (``pipeline.qwen_vl_prompts``: M-RoPE
positions, Qwen3-VL's deepstack) gives the grouped teacher-forced scoring transformers' own Qwen-VL values, and both
cycle loops run on it (loop 1 with the gt region drawn into the image).

Needs transformers >= 4.57 (Qwen3-VL): skipped on an older stack."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("transformers", minversion="4.57")  # Qwen3VLForConditionalGeneration

from projects.llava_sam2.rl_train.model.decoding.fast_decode_step import rope_table  # noqa: E402
from projects.llava_sam2.rl_train.model.decoding.generation import (  # noqa: E402
    position_ids_from_attention, sample_completions)
from projects.llava_sam2.rl_train.model.decoding.text_decoding import TextDecoding  # noqa: E402
from projects.llava_sam2.rl_train.model.pipeline.qwen_vl_decode import qwen_vl_completions  # noqa: E402
from projects.llava_sam2.rl_train.model.decoding.grouped_scoring import grouped_completion_logprobs  # noqa: E402
from projects.llava_sam2.rl_train.model.pipeline.qwen_vl_prompts import qwen_vl_prompt_inputs  # noqa: E402
from projects.llava_sam2.rl_train.model.network.lora import configure_trainable  # noqa: E402
from projects.llava_sam2.rl_train.model.pipeline.inference import predict  # noqa: E402
from projects.llava_sam2.rl_train.model.pipeline.shared import (  # noqa: E402
    PromptRow, encode_images, forced_answer_masks, forced_answer_seg_prompts, greedy_answers)
from projects.llava_sam2.rl_train.model.text.qwen_processor import Sa2VAQwenProcessor  # noqa: E402
from projects.llava_sam2.rl_train.data.shapes_video import ShapesVideoWorld  # noqa: E402
from projects.llava_sam2.rl_train.grpo.cycle import caption_logp  # noqa: E402
from projects.llava_sam2.rl_train.grpo.features import loop_features  # noqa: E402
from projects.llava_sam2.rl_train.grpo.rollout import CaptionReplay  # noqa: E402
from projects.llava_sam2.rl_train.model.pipeline.qwen_vl_prompts import qwen_vl_sample_text  # noqa: E402
from projects.llava_sam2.rl_train.model.pipeline.qwen_vl_regions import draw_regions  # noqa: E402
from grpo_tiny import CaptionParityReward, make_algo, one_thread, run_rollout, shapes_batch, step_loss  # noqa: E402
from qwen_vl_fixtures import (FAMILIES, PREDICT_TEXT, predict_image, seg_then_stop_model,  # noqa: E402
                              tiny_qwen_hf_processor, tiny_qwen_model, tiny_qwen_tokenizer)

G = 2  # completions per prompt
_one_thread = pytest.fixture(autouse=True)(one_thread)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_qwen_tokenizer()


def _batch(family: str, tokenizer):
    """Replica, its processor, two encoded images of different grids, and two left-padded RES prompts about them."""
    model = tiny_qwen_model(family)
    model.bind_tokenizer(tokenizer)
    processor = Sa2VAQwenProcessor.from_config(tokenizer, model.config, min_pixels=4 * 28 * 28,
                                               max_pixels=16 * 28 * 28)
    rng = np.random.default_rng(0)
    images = [Image.fromarray((rng.random(shape) * 255).astype(np.uint8)) for shape in ((70, 100, 3), (60, 60, 3))]
    encoded = encode_images(model, processor, images, ["image 0", "image 1"])
    assert encoded.vision_inputs[0][1].tolist() != encoded.vision_inputs[1][1].tolist()  # two different grids
    prompts = [processor.segment_prompt(encoded.n_tiles(0), "the circle"),
               processor.segment_prompt(encoded.n_tiles(1), "the small blue square on the left")]
    ids, attention = processor.tokenize_prompts(prompts)  # [2, L], left padded
    assert not attention[0].all() and attention[1].all()
    return model, encoded, ids, attention.bool()


def _completions(seed: int = 0):
    """N = 2·G right-padded completions of plain text tokens (lengths 5, 3, 4, 1)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(20, 200, (2 * G, 5), generator=generator)  # [N, T]
    mask = torch.arange(5)[None] < torch.tensor([5, 3, 4, 1])[:, None]  # [N, T]
    return ids, mask


def _transformers_logprobs(model, encoded, ids, attention, completion_ids, completion_mask) -> torch.Tensor:
    """``[N, T]``: each completion scored by the Qwen-VL model's own forward (pixel_values path) over its prompt's
    unpadded tokens + its real tokens, one row at a time."""
    out = torch.zeros(completion_ids.shape)
    for n in range(len(completion_ids)):
        b = n // G
        prompt = ids[b][attention[b]]
        answer = completion_ids[n][completion_mask[n]]
        full = torch.cat([prompt, answer])[None]  # [1, L_b + T_n]
        pixels, grid = encoded.vision_inputs[b]
        logits = model.llm_forward(full, torch.ones_like(full), pixels, grid[None]).logits[0]  # [L_b + T_n, V]
        logp = torch.log_softmax(logits[len(prompt) - 1:-1].float(), dim=-1)  # position L_b - 1 + t predicts c_t
        out[n, :len(answer)] = logp.gather(-1, answer[:, None])[:, 0]
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_grouped_scoring_of_a_qwen_vl_prompt_equals_transformers_own_forward(family, tokenizer):
    """Two prompts about two images of different grids (one left padded), G = 2 completions each: the grouped
    teacher-forced log-probs, given the family seam's embeddings, M-RoPE positions and (Qwen3-VL) deepstack
    additions, equal the transformers Qwen-VL forward on the same tokens. Without the seam's positions and additions
    (the 1-D positions every family got before) they do not."""
    model, encoded, ids, attention = _batch(family, tokenizer)
    completion_ids, completion_mask = _completions()
    with torch.no_grad():
        expected = _transformers_logprobs(model, encoded, ids, attention, completion_ids, completion_mask)
        inputs = qwen_vl_prompt_inputs(model, encoded, [0, 1], ids, attention)
        assert inputs.positions.shape == (3, *ids.shape)
        assert len(inputs.layer_additions) == (0 if family == "qwen2_5_vl" else
                                               len(model.model.config.vision_config.deepstack_visual_indexes))
        ours = grouped_completion_logprobs(model.hf_model, inputs.embeds, attention, completion_ids, completion_mask,
                                           num_generations=G, prompt_positions=inputs.positions,
                                           prefix_additions=inputs.layer_additions)
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
        text_positions = position_ids_from_attention(attention)[None].expand(3, -1, -1)  # 1-D on every axis
        one_d = grouped_completion_logprobs(model.hf_model, inputs.embeds, attention, completion_ids,
                                            completion_mask, num_generations=G, prompt_positions=text_positions)
        no_deepstack = grouped_completion_logprobs(model.hf_model, inputs.embeds, attention, completion_ids,
                                                   completion_mask, num_generations=G,
                                                   prompt_positions=inputs.positions)
    assert (one_d - expected).abs().max() > 1e-4  # the replica is sensitive to the positions: the test can fail
    if inputs.layer_additions:  # Qwen3-VL: and to the deepstack features
        assert (no_deepstack - expected).abs().max() > 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_a_forced_seg_answer_gives_the_mask_and_seg_prompt_of_the_familys_predict(family, tokenizer):
    """The replica whose head answers ``[SEG]<|im_end|>``: the forced answer ``[SEG]<|im_end|>`` (loop 2's policy
    pass, ``forced_answer_masks``) on its RES prompt, left padded beside a longer prompt, gives the SAM2 prompt the
    family's greedy decode read from transformers' generate and, at image size, predict's mask pixel for pixel."""
    model = seg_then_stop_model(family, tokenizer)
    processor = Sa2VAQwenProcessor.from_config(tokenizer, model.config, image_processor=tiny_qwen_hf_processor(
        family, tokenizer).image_processor)
    image = predict_image()
    expected_masks = predict(model, processor, image, PREDICT_TEXT)["prediction_masks"]
    assert len(expected_masks) == 1 and np.asarray(expected_masks[0]).any()
    encoded = encode_images(model, processor, [image], ["image 0"])
    prompts = [processor.template_user_turn(processor.expand_image(text, encoded.n_tiles(0)))
               for text in (PREDICT_TEXT, PREDICT_TEXT + " It is the round one near the top left corner.")]
    greedy, = greedy_answers(model, processor, encoded, [PromptRow(0, prompts[0])], max_new_tokens=4,
                             seg_masks="first")
    assert greedy.text == "[SEG]<|im_end|>"
    ids, attention = processor.tokenize_prompts(prompts)  # [2, L], the first row left padded
    assert not attention[0].all()
    answer_ids = torch.tensor(tokenizer.encode("[SEG]<|im_end|>", add_special_tokens=False))
    with torch.no_grad():
        decoded = forced_answer_masks(model, encoded, None, ids, attention, [0, 0], answer_ids, 0)
    masks = model.logits_to_masks(decoded.best_logits[:1], [encoded.image_sizes[0]])
    assert np.array_equal(masks[0].cpu().numpy(), np.asarray(expected_masks[0]))
    with torch.no_grad():
        forced = forced_answer_seg_prompts(model, encoded, None, ids, attention, [0, 0], answer_ids[None].expand(2, -1),
                                           torch.zeros(2, dtype=torch.long))  # [2, C_sam]
    torch.testing.assert_close(forced[0], greedy.seg_prompts[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_seg_state_norm_flag_says_what_transformers_hidden_states_hold(family, tokenizer):
    """``seg_state_after_final_norm`` pins what ``output_hidden_states[-1]`` (upstream's [SEG] state) is in the
    installed transformers: the head on it gives the logits exactly when it is after the final norm."""
    model = tiny_qwen_model(family)
    model.bind_tokenizer(tokenizer)
    processor = Sa2VAQwenProcessor.from_config(tokenizer, model.config, min_pixels=4 * 28 * 28,
                                               max_pixels=16 * 28 * 28)
    encoded = encode_images(model, processor, [predict_image()], ["image 0"])
    ids, attention = processor.tokenize_prompts([processor.segment_prompt(encoded.n_tiles(0), "the circle")])
    pixels, grid = encoded.vision_inputs[0]
    with torch.no_grad():
        out = model.llm_forward(ids, attention.long(), pixels, grid[None])
        state = out.hidden_states[-1]
        normed = model.language_model.norm(state) if not model.seg_state_after_final_norm else state
        torch.testing.assert_close(model.get_output_embeddings()(normed), out.logits, atol=1e-5, rtol=1e-5)


def _loss_grads(model, encoded, ids, attention, completion_ids, completion_mask) -> dict[str, torch.Tensor]:
    """Grads of a GRPO-shaped loss on the seam's two passes: the grouped log-probs of the completions (loop 1's
    caption action) + the forced ``[SEG]`` answer's mask logits (loop 2's mask head)."""
    model.zero_grad(set_to_none=True)
    inputs = qwen_vl_prompt_inputs(model, encoded, [0, 1], ids, attention)
    logp = grouped_completion_logprobs(model.hf_model, inputs.embeds, attention, completion_ids, completion_mask,
                                       num_generations=G, prompt_positions=inputs.positions,
                                       prefix_additions=inputs.layer_additions)
    seg_answer = torch.tensor([model.seg_token_id, 30])  # [SEG] then a plain token
    mask_logits = forced_answer_masks(model, encoded, None, ids, attention, [0, 1], seg_answer, 0).best_logits
    (logp.sum() + mask_logits.sigmoid().mean()).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad and p.grad is not None}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_seam_passes_train_lora_and_the_mask_decoder_with_or_without_checkpointing(family, tokenizer):
    """With LoRA (upstream's targets) and the trainable set of the family, a loss over both seam passes gives finite
    grads on every LoRA layer, ``text_hidden_fcs`` and the SAM2 mask decoder, none on the vision tower; activation
    checkpointing (the grouped layer recomputed in backward, deepstack additions included) gives the same grads."""
    model, encoded, ids, attention = _batch(family, tokenizer)
    model.apply_lora(r=4, lora_alpha=8, lora_dropout=0.0)
    trainable = configure_trainable(model)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, param in trainable.items():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    completion_ids, completion_mask = _completions(seed=1)
    model.train()
    plain = _loss_grads(model, encoded, ids, attention, completion_ids, completion_mask)
    unreached = set(trainable) - set(plain)  # only the heads a best-of-multimask mask loss does not differentiate
    assert set(plain) <= set(trainable) and all(".iou_prediction_head." in n or ".pred_obj_score_head." in n
                                                 for n in unreached)
    assert {n for n in trainable if "lora_" in n} <= set(plain)
    assert all(torch.isfinite(g).all() for g in plain.values())
    lora_layers = {name.split(".lora_")[0] for name in plain if "lora_" in name}
    assert lora_layers and all(any(plain[n].abs().sum() > 0 for n in plain if n.startswith(layer + ".lora_"))
                               for layer in lora_layers)
    for part in ("text_hidden_fcs.", "grounding_encoder.sam2_model.sam_mask_decoder."):
        assert sum(g.abs().sum() for n, g in plain.items() if n.startswith(part)) > 0, part
    model.hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert model.language_model.gradient_checkpointing
    checkpointed = _loss_grads(model, encoded, ids, attention, completion_ids, completion_mask)
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("family", FAMILIES)
def test_one_loop_2_grpo_step_trains_lora_and_the_mask_decoder(family, tokenizer):
    """Loop 2 (caption → mask → caption') on the family: rollout (forced ``[SEG]`` answer through the seam, G = 4
    Bernoulli masks per caption, the EMA partner describing each mask drawn into its image), IoU reward, one policy
    loss: finite, with grads on LoRA, ``text_hidden_fcs`` and the mask decoder. The region mask policy, which needs
    the InternVL region-token grid, is refused with the policies that work here."""
    model = tiny_qwen_model(family)
    model.bind_tokenizer(tokenizer)
    model.apply_lora(r=4, lora_alpha=8, lora_dropout=0.0)
    trainable = configure_trainable(model)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in trainable.items():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    processor = Sa2VAQwenProcessor.from_config(tokenizer, model.config, min_pixels=4 * 28 * 28,
                                               max_pixels=16 * 28 * 28)
    loop2 = dict(mask_to_caption_weight=0.0, caption_to_mask_weight=1.0, seg_noise_std=1.0)
    algo, _ = make_algo(model, processor, {"caption_to_mask": [dict(type="iou")]}, use_partner_captions=True,
                        mask_policy="bernoulli", **loop2)
    model.zero_grad(set_to_none=True)
    step = run_rollout(algo, shapes_batch(2))
    assert step.rollouts[0].advantages.abs().sum() > 0
    loss = step_loss(algo, model, step)["loss"]
    assert torch.isfinite(loss)
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    assert all(torch.isfinite(g).all() for g in grads.values())
    for part in ("lora_", "text_hidden_fcs.", ".sam_mask_decoder."):
        assert sum(float(g.abs().sum()) for n, g in grads.items() if part in n) > 0, part
    assert not any(".visual." in n for n in grads)
    region, _ = make_algo(model, processor, {"caption_to_mask": [dict(type="iou")]}, use_partner_captions=False,
                          mask_policy="region", **loop2)
    with pytest.raises(ValueError, match="region-token grid"):
        run_rollout(region, shapes_batch(2))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_reference_decoder_on_the_seam_decodes_as_transformers_generate(family, tokenizer):
    """Greedy decoding of two left-padded prompts about images of different grids by the reference decoder
    (``sample_completions`` on the seam's embeddings, M-RoPE positions and Qwen3-VL's deepstack at the prefill) gives
    transformers' ``generate`` tokens and per-token log-probs (``qwen_vl_decode``, the family's predict decoder);
    1-D positions, or Qwen3-VL without its deepstack, do not."""
    model, encoded, ids, attention = _batch(family, tokenizer)
    decoding = TextDecoding(tokenizer=tokenizer, stop_token_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),),
                            stop_words=(), pad_token_id=tokenizer.pad_token_id)
    expected = qwen_vl_completions(model, encoded, [0, 1], ids, attention, decoding, max_new_tokens=6,
                                   return_hidden=False)
    with torch.no_grad():
        inputs = qwen_vl_prompt_inputs(model, encoded, [0, 1], ids, attention)
        kwargs = dict(max_new_tokens=6, do_sample=False, stop_token_ids=list(decoding.stop_token_ids),
                      pad_token_id=decoding.pad_token_id)
        ours = sample_completions(model.hf_model, inputs.embeds, attention, prompt_positions=inputs.positions,
                                  prefill_kwargs=inputs.prefill_kwargs(), **kwargs)
        text_positions = position_ids_from_attention(attention)[None].expand(3, -1, -1)
        one_d = sample_completions(model.hf_model, inputs.embeds, attention, prompt_positions=text_positions,
                                   prefill_kwargs=inputs.prefill_kwargs(), **kwargs)
        no_deepstack = sample_completions(model.hf_model, inputs.embeds, attention,
                                          prompt_positions=inputs.positions, **kwargs)
    T = expected.ids.shape[1]
    assert T >= 3 and torch.equal(ours.completion_mask[:, :T], expected.completion_mask)
    assert torch.equal(ours.ids[:, :T][expected.completion_mask], expected.ids[expected.completion_mask])
    torch.testing.assert_close(ours.token_logp[:, :T], expected.token_logp, atol=1e-5, rtol=1e-5)
    assert (one_d.token_logp[:, :T] - expected.token_logp).abs().max() > 1e-4
    if inputs.layer_additions:  # Qwen3-VL: the deepstack features at the prefill matter too
        assert (no_deepstack.token_logp[:, :T] - expected.token_logp).abs().max() > 1e-4


def _rotated(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Plain 1-D RoPE: ``q cos + rotate_half(q) sin``."""
    half = q.shape[-1] // 2
    return q * cos + torch.cat([-q[..., half:], q[..., :half]], dim=-1) * sin


@pytest.mark.parametrize("family", FAMILIES)
def test_the_fast_steps_rope_is_transformers_m_rope_at_positions_equal_on_the_three_axes(family):
    """A generated token's M-RoPE position is the same on the three axes. There transformers' own Qwen-VL rotary and
    rotation (Qwen2.5-VL's ``mrope_section`` blocks, Qwen3-VL's interleaved axes) are plain 1-D RoPE with the fast
    step's table (``rope_table(multimodal=True)``) at that position, in the layout each family's layers take; positions
    that differ between axes (an image token's) are not."""
    rotary = tiny_qwen_model(family).language_model.rotary_emb
    cos, sin, axes = rope_table(rotary, 48, torch.zeros(1, 1, 4), multimodal=True)  # [48, hd]
    assert axes == (3 if family == "qwen2_5_vl" else 0)
    positions = torch.tensor([3, 17, 47])  # one per row
    q = torch.randn(3, 2, 1, cos.shape[-1], generator=torch.Generator().manual_seed(0))  # [N, H, 1, hd]
    ours = _rotated(q, cos[positions][:, None, None], sin[positions][:, None, None])

    def transformers_rotation(axis_positions: torch.Tensor) -> torch.Tensor:  # [3, N] -> rotated q
        ref_cos, ref_sin = rotary(q, axis_positions[..., None])  # the family's layout, one position per row
        if family == "qwen2_5_vl":
            from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_multimodal_rotary_pos_emb
            sections = rotary.config.rope_scaling["mrope_section"]
            return apply_multimodal_rotary_pos_emb(q, q, ref_cos, ref_sin, sections)[0]
        from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb
        return apply_rotary_pos_emb(q, q, ref_cos, ref_sin)[0]

    torch.testing.assert_close(transformers_rotation(positions.expand(3, -1)), ours, atol=1e-6, rtol=1e-6)
    image_like = torch.stack([positions, positions - 2, positions - 1])  # unequal axes
    assert (transformers_rotation(image_like) - ours).abs().max() > 1e-3


def _decoding(tokenizer, decode_backend: str = "fast") -> TextDecoding:
    return TextDecoding(tokenizer=tokenizer, stop_token_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),),
                        stop_words=(), pad_token_id=tokenizer.pad_token_id, decode_backend=decode_backend)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_fast_decoder_answers_greedily_as_transformers_generate_with_its_seg_states(family, tokenizer):
    """Greedy answers on the fast decoder (``qwen_vl_sample_text``: one prefill per prompt with M-RoPE positions and
    Qwen3-VL's deepstack, then the static-cache step) give ``generate``'s tokens, per-token log-probs and fed-back
    states, the states where upstream reads ``[SEG]`` (after the final norm on Qwen2.5-VL, before it on Qwen3-VL), for
    two left-padded prompts about images of different grids."""
    model, encoded, ids, attention = _batch(family, tokenizer)
    expected = qwen_vl_completions(model, encoded, [0, 1], ids, attention, _decoding(tokenizer), max_new_tokens=6,
                                   return_hidden=True)
    ours = qwen_vl_sample_text(model, encoded, [0, 1], ids, attention, _decoding(tokenizer), num_generations=1,
                               max_new_tokens=6, do_sample=False, return_hidden=True)
    T, mask = expected.ids.shape[1], expected.completion_mask
    assert T >= 3 and torch.equal(ours.completion_mask[:, :T], mask) and not ours.completion_mask[:, T:].any()
    assert torch.equal(ours.ids[:, :T][mask], expected.ids[mask])
    torch.testing.assert_close(ours.token_logp[:, :T], expected.token_logp, atol=1e-5, rtol=1e-5)
    fed_back = mask[:, :T - 1]  # the last chosen token is never fed back
    torch.testing.assert_close(ours.hidden[:, :T - 1][fed_back], expected.hidden[:, :T - 1][fed_back],
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_fast_sampling_prefills_each_prompt_once_and_draws_the_reference_decoders_tokens(family, tokenizer):
    """G = 3 seeded samples (temperature 0.7, top-p 0.9) of three prompts, two about one image: the fast decoder runs
    the vision tower on the two distinct images and prefills each prompt once (the reference decoder: G times), and
    draws the reference decoder's tokens with its per-token log-probs within 1e-5."""
    model, encoded, ids, attention = _batch(family, tokenizer)
    rows, images = [0, 1, 0], [0, 1, 0]
    prefill_rows, image_grids = [], []
    model.language_model.register_forward_pre_hook(
        lambda _, args, kwargs: prefill_rows.append(kwargs["inputs_embeds"].shape[0])
        if kwargs["inputs_embeds"].shape[1] > 1 else None, with_kwargs=True)
    model.visual.register_forward_pre_hook(lambda _, args, kwargs: image_grids.append(len(kwargs["grid_thw"])),
                                           with_kwargs=True)
    kwargs = dict(num_generations=3, max_new_tokens=6, do_sample=True, temperature=0.7, top_p=0.9)
    fast = qwen_vl_sample_text(model, encoded, images, ids[rows], attention[rows], _decoding(tokenizer),
                               generator=torch.Generator().manual_seed(0), **kwargs)
    assert prefill_rows == [3] and image_grids == [2]
    reference = qwen_vl_sample_text(model, encoded, images, ids[rows], attention[rows],
                                    _decoding(tokenizer, "reference"), generator=torch.Generator().manual_seed(0),
                                    **kwargs)
    assert prefill_rows[1:] == [9]
    assert fast.completion_mask.sum() > 9  # more than one token per row
    assert torch.equal(fast.completion_mask, reference.completion_mask) and torch.equal(fast.ids, reference.ids)
    torch.testing.assert_close(fast.token_logp, reference.token_logp, atol=1e-5, rtol=1e-5)


def _lora_replica(family: str, tokenizer, seed: int = 3):
    """The replica with LoRA (r = 4, no dropout), the family's trainable set and lora_B drawn from N(0, 0.02²) (so
    every LoRA tensor is on a gradient path), and its processor at a few image tokens."""
    model = tiny_qwen_model(family)
    model.bind_tokenizer(tokenizer)
    model.apply_lora(r=4, lora_alpha=8, lora_dropout=0.0)
    trainable = configure_trainable(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in trainable.items():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    processor = Sa2VAQwenProcessor.from_config(tokenizer, model.config, min_pixels=4 * 28 * 28,
                                               max_pixels=16 * 28 * 28)
    return model, processor


LOOP1_ONLY = dict(mask_to_caption_weight=1.0, caption_to_mask_weight=0.0)


@pytest.mark.parametrize("family", FAMILIES)
def test_loop_1_samples_on_the_drawn_region_what_its_loss_pass_scores(family, tokenizer):
    """Loop 1's policy pass on the family: G = 4 captions sampled (temperature 0.7, top-p 0.9) for two samples' gt
    regions drawn into their images, through the seam (M-RoPE, deepstack at the prefill); the sampler's per-token
    log-probs equal the teacher-forced ``caption_logp`` (what old_logp, ref_logp and the loss run) within 1e-5 fp32,
    with the reference and the fused log-prob head alike. The drawn region is the input: the same captions scored
    on the undrawn images give other values."""
    model, processor = _lora_replica(family, tokenizer)
    algo, _ = make_algo(model, processor, {"mask_to_caption": [CaptionParityReward()]}, temperature=0.7, top_p=0.9,
                        **LOOP1_ONLY)
    loop = algo.loops[0]
    features = loop_features(algo.encode(shapes_batch(2)), loop.name)
    assert features.region_cells is None and features.drawn_regions is not None
    ids, attention = loop.region_prompts(features)  # [2, L]
    G = 4
    completions = qwen_vl_sample_text(model, features.drawn_regions, range(2), ids, attention, algo.context.decoding,
                                      num_generations=G, max_new_tokens=6, do_sample=True, temperature=0.7,
                                      top_p=0.9, generator=torch.Generator().manual_seed(0))
    assert completions.completion_mask.sum() > 2 * G  # captions of more than one token
    replay = CaptionReplay(prompt_ids=ids.repeat_interleave(G, 0), prompt_attention=attention.repeat_interleave(G, 0),
                           completion_ids=completions.ids, image_index=features.image_index.repeat_interleave(G))
    with torch.no_grad():
        scored = {head: caption_logp(model, features, None, replay, completions.completion_mask, range(2), G, 0.7,
                                     head) for head in ("reference", "fused")}
        undrawn = replace(features, drawn_regions=draw_regions(
            processor, [s.image for s in features.samples], [torch.zeros_like(m) for m in features.gt_masks],
            features.sample_ids))
        plain = caption_logp(model, undrawn, None, replay, completions.completion_mask, range(2), G, 0.7, "reference")
    for head, logp in scored.items():
        torch.testing.assert_close(logp, completions.token_logp, atol=1e-5, rtol=1e-5, msg=head)
    assert (plain - completions.token_logp).abs().max() > 1e-4


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def _grad_sum(grads: dict[str, torch.Tensor], part: str) -> float:
    return sum(float(g.abs().sum()) for n, g in grads.items() if part in n)


@pytest.mark.parametrize("family", FAMILIES)
def test_one_loop_1_grpo_step_trains_lora_with_the_first_ratio_exactly_1(family, tokenizer):
    """One loop-1 (mask → caption → mask') GRPO step on the family, one group per rollout chunk and per minibatch
    (so the rollout keeps old_logp, and the second group's drawn image is found by its sample offset) and a KL term
    (ref_logp under the reference weights): the partner grounds each caption with the family's greedy RES answer,
    each minibatch's loss-pass log-probs equal its old_logp bit for bit (ratio exactly 1), and the loss is finite
    with grads on every LoRA layer and nowhere else (the caption reads no mask head; the vision tower is frozen)."""
    model, processor = _lora_replica(family, tokenizer)
    rewards = {"mask_to_caption": [CaptionParityReward(), dict(type="iou")]}
    algo, _ = make_algo(model, processor, rewards, beta=0.04, minibatch_size=4, generation_chunk_size=4,
                        **LOOP1_ONLY)
    step = run_rollout(algo, shapes_batch(2))
    rollout, = step.rollouts
    assert rollout.old_logp is not None and rollout.ref_logp is not None and torch.isfinite(rollout.ref_logp).all()
    assert rollout.advantages.abs().sum() > 0, "the test reward gave every group zero spread; no signal"
    assert rollout.reward_stats["partner/answer_tokens"] > 0  # the partner answered every caption's RES prompt
    model.train()
    minibatches = list(algo.minibatches(step))
    assert [list(mb.parts[0].samples) for mb in minibatches] == [[0], [1]]
    for minibatch in minibatches:
        part, = minibatch.parts
        logp = part.loop.action_logp(model, part.features, None, part.rollout, part.samples)
        assert logp.requires_grad and torch.equal(logp.detach(), part.rollout.old_logp)
    model.zero_grad(set_to_none=True)
    out = step_loss(algo, model, step)
    assert torch.isfinite(out["loss"]) and out["mask_to_caption/ratio_mean"] == 1.0
    grads = _grads(model)
    assert all(torch.isfinite(g).all() for g in grads.values())
    lora = {n for n in grads if "lora_" in n}
    assert lora == {n for n, p in model.named_parameters() if p.requires_grad and "lora_" in n}
    assert all(grads[n].abs().sum() > 0 for n in lora if "lora_A" in n)
    assert set(grads) == lora  # text_hidden_fcs and the mask decoder are not on loop 1's path


@pytest.mark.parametrize("family", FAMILIES)
def test_both_loops_step_with_loop_1_dense_loss_trains_lora_and_the_mask_head(family, tokenizer):
    """Both loops in one step on the family (loop 1 with its dense self-segmentation loss, loop 2 with Bernoulli
    masks): finite loss, grads on LoRA, ``text_hidden_fcs`` and the mask decoder, none on the vision tower; both
    loops report their terms."""
    model, processor = _lora_replica(family, tokenizer)
    rewards = {"mask_to_caption": [CaptionParityReward()], "caption_to_mask": [dict(type="iou")]}
    algo, _ = make_algo(model, processor, rewards, use_partner_captions=True, mask_policy="bernoulli",
                        seg_noise_std=1.0, mask_to_caption_weight=1.0, caption_to_mask_weight=1.0,
                        mask_to_caption_dense_weight=1.0)
    step = run_rollout(algo, shapes_batch(2))
    assert [r.loop for r in step.rollouts] == ["mask_to_caption", "caption_to_mask"]
    model.zero_grad(set_to_none=True)
    out = step_loss(algo, model, step)
    assert torch.isfinite(out["loss"]) and float(out["mask_to_caption/dense_frac"]) > 0
    assert "caption_to_mask/pg_term" in out
    grads = _grads(model)
    assert all(torch.isfinite(g).all() for g in grads.values())
    for part in ("lora_", "text_hidden_fcs.", ".sam_mask_decoder."):
        assert _grad_sum(grads, part) > 0, part
    assert not any(".visual." in n for n in grads)


def test_a_video_step_is_refused_on_the_family_naming_the_setting(tokenizer):
    """Video clips have no encoder or prompt on the family: ``encode`` refuses them, naming video and the family."""
    model, processor = _lora_replica("qwen2_5_vl", tokenizer)
    algo, _ = make_algo(model, processor, {"mask_to_caption": [CaptionParityReward()]}, **LOOP1_ONLY)
    clips = ShapesVideoWorld("train", 2, seed=0, image_size=32, num_frames=3)
    with pytest.raises(ValueError, match="video steps .* not supported on the Qwen-VL family"):
        algo.encode([clips[0], clips[1]])
