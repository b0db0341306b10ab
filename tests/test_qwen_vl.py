"""The Qwen-VL family (Sa2VA-Qwen2.5-VL-3B/7B, Sa2VA-Qwen3-VL-4B, upstream codebase v2's ``Sa2VAChatModelQwen``):
presets of the released sizes, the HF layout round trip of tiny Qwen2.5-VL and Qwen3-VL replicas, and parity with
upstream's own HF code in both directions, pinned as data (docs/upstream.md, "The Qwen-VL family").

Needs transformers >= 4.57 (Qwen3-VL; Qwen2.5-VL alone would need 4.49): skipped on an older stack."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("transformers", minversion="4.57")  # Qwen3VLForConditionalGeneration; reason in the docstring

from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import (  # noqa: E402
    checkpoint_layout, checkpoint_state_dict, load_pretrained, save_pretrained)
from projects.llava_sam2.rl_train.model.network import qwen_vl  # noqa: E402
from projects.llava_sam2.rl_train.model.network.lora import configure_trainable  # noqa: E402
from projects.llava_sam2.rl_train.model.network.presets import build_preset  # noqa: E402
from projects.llava_sam2.rl_train.model.network.qwen_vl import Sa2VAQwenConfig, Sa2VAQwenModel  # noqa: E402
from projects.llava_sam2.rl_train.model.pipeline.inference import predict  # noqa: E402
from projects.llava_sam2.rl_train.model.pipeline.shared import (  # noqa: E402
    Answer, PromptRow, describe_masks, encode_images, greedy_answers, segment_texts)
from projects.llava_sam2.rl_train.model.text.qwen_processor import Sa2VAQwenProcessor  # noqa: E402
from qwen_vl_fixtures import (FAMILIES, PREDICT_IMAGE_SIZE, PREDICT_TEXT, our_outputs, pinned_outputs,  # noqa: E402
                              predict_image, reference_inputs, seg_then_stop_model, seg_writing_head,
                              tiny_qwen_config, tiny_qwen_hf_processor, tiny_qwen_model, tiny_qwen_tokenizer)

DATA = Path(__file__).resolve().parent / "data"
PARITY_TOLERANCE = 1e-5  # max |ours - upstream|, fp32


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_qwen_tokenizer()


@pytest.fixture(scope="module", params=FAMILIES)
def replica(request):
    return request.param, tiny_qwen_model(request.param)


# text hidden, layers, heads, kv heads, FFN; vision depth / width; LLM tokens of the image pad
@pytest.mark.parametrize("name, family, text_dims, vision_dims", [
    ("qwen25vl_3b", "qwen2_5_vl", (2048, 36, 16, 2, 11008), (32, 1280)),
    ("qwen25vl_7b", "qwen2_5_vl", (3584, 28, 28, 4, 18944), (32, 1280)),
    ("qwen3vl_4b", "qwen3_vl", (2560, 36, 32, 8, 9728), (24, 1024)),
])
def test_qwen_vl_presets_build_the_released_shapes_on_the_meta_device(name, family, text_dims, vision_dims):
    config = build_preset(name)
    assert isinstance(config, Sa2VAQwenConfig) and config.family == family and config.template == "qwen_chat"
    with torch.device("meta"):
        model = Sa2VAQwenModel(config)
    text = model.model.config.get_text_config()
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads,
            text.intermediate_size) == text_dims
    vision = model.model.config.vision_config
    assert (vision.depth, vision.hidden_size) == vision_dims and vision.out_hidden_size == text_dims[0]
    layout = checkpoint_layout(model)
    assert layout["model.lm_head.weight"] == (config.vocab_size, text_dims[0])  # untied: Sa2VA saves its own head
    assert layout["text_hidden_fcs.2.weight"] == (256, text_dims[0])
    assert any(key.endswith(".g_weight") for key in layout) and not any(key.endswith(".gamma") for key in layout)
    assert not any(key.startswith(("language_model.", "vision_model.", "mlp1.")) for key in layout)


def test_tiny_replica_round_trips_bit_exactly_in_upstreams_layout(replica, tokenizer, tmp_path):
    family, model = replica
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path, attn_implementation="eager")
    assert isinstance(loaded, Sa2VAQwenModel) and loaded.config == model.config
    ours, saved = model.state_dict(), loaded.state_dict()
    assert ours.keys() == saved.keys()
    assert not [k for k in ours if not torch.equal(ours[k], saved[k])]
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == ["Sa2VAChatModelQwen"] and written["model_type"] == "sa2va_chat"
    assert written["auto_map"]["AutoModel"] == "modeling_sa2va_qwen.Sa2VAChatModelQwen"
    assert written["vision_config"]["model_type"] == family and written["template"] == "qwen_chat"
    inputs = reference_inputs(tokenizer, model.config)
    before, after = our_outputs(model, tokenizer, inputs), our_outputs(loaded, tokenizer, inputs)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_family_missing_from_the_installed_transformers_says_which_release_it_needs(monkeypatch):
    monkeypatch.setattr(qwen_vl.transformers, "__version__", "4.56.2")
    with pytest.raises(ValueError, match=r"qwen3_vl checkpoints need transformers >= 4\.57"):
        Sa2VAQwenModel(tiny_qwen_config("qwen3_vl"))


def test_a_tokenizer_without_the_image_pad_token_is_refused(replica):
    _, model = replica
    from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

    with pytest.raises(ValueError, match=r"<\|image_pad\|>"):
        model.bind_tokenizer(load_tiny_tokenizer())


def assert_matches_upstream(model: Sa2VAQwenModel, family: str, tokenizer) -> None:
    inputs = reference_inputs(tokenizer, model.config)
    ours = pinned_outputs(our_outputs(model, tokenizer, inputs), tokenizer, inputs)
    reference = load_file(str(DATA / f"qwen_vl_upstream_reference_{family}.safetensors"))
    assert set(reference) == {"logits", "seg_prompt", "mask_logits"}
    for key, expected in reference.items():
        assert ours[key].shape == expected.shape, key
        err = (ours[key] - expected).abs().max().item()
        assert err <= PARITY_TOLERANCE, f"{family} {key}: max |ours - upstream| = {err:.2e} > {PARITY_TOLERANCE}"


def test_our_checkpoint_gives_upstream_qwen_code_our_outputs(replica, tokenizer):
    """Direction A: upstream's Sa2VAChatModelQwen loaded our save_pretrained of the replica strictly; its forward
    (LLM logits, [SEG] prompt, mask logits) is pinned, and ours on the same weights and input matches it."""
    family, model = replica
    assert_matches_upstream(model, family, tokenizer)


def test_a_checkpoint_upstream_qwen_code_saved_loads_here_with_its_outputs(replica, tokenizer, tmp_path):
    """Direction B: upstream's save_pretrained wrote the config.json and key layout pinned here; we read that
    config.json, build exactly that layout, and the replica's weights under those names give upstream's outputs."""
    family, model = replica
    saved = json.loads((DATA / f"qwen_vl_upstream_saved_{family}.json").read_text())
    with torch.device("meta"):
        layout = checkpoint_layout(Sa2VAQwenModel(Sa2VAQwenConfig.from_dict(saved["config"])))
    assert layout == {key: tuple(shape) for key, shape in saved["layout"].items()}
    (tmp_path / "config.json").write_text(json.dumps(saved["config"]))
    save_file(checkpoint_state_dict(model), str(tmp_path / "model.safetensors"))
    loaded = load_pretrained(tmp_path, attn_implementation="eager")
    assert isinstance(loaded, Sa2VAQwenModel) and loaded.config.family == family
    assert_matches_upstream(loaded, family, tokenizer)


def test_res_answers_run_the_shared_pipeline_and_read_seg_states_as_a_teacher_forced_pass(replica, tokenizer):
    """Greedy answers on an image: the fast decoder on the family seam, then the shared answer / [SEG] / mask
    code. Each kept [SEG]'s SAM2 prompt (from the decode's states, as upstream reads them) equals the one of a
    teacher-forced forward over prompt + answer at that [SEG]'s input position, and each gives a mask at image size."""
    family, model = replica
    model = copy.deepcopy(model)
    model.bind_tokenizer(tokenizer)
    processor = Sa2VAQwenProcessor.from_config(tokenizer, model.config, min_pixels=4 * 28 * 28, max_pixels=16 * 28 * 28)
    image = Image.fromarray((np.random.default_rng(0).random((70, 100, 3)) * 255).astype(np.uint8))
    encoded = encode_images(model, processor, [image], ["image 0"])
    prompt = processor.template_user_turn(processor.expand_image("<image>Please segment the circle.",
                                                                 encoded.n_tiles(0)))
    ids, attention = processor.tokenize_prompts([prompt])
    pixels, grid = encoded.vision_inputs[0]
    first = model.llm_forward(ids, attention.long(), pixels, grid[None]).hidden_states[-1][0, -1]
    seg_writing_head(model, tokenizer, first)
    answer, = greedy_answers(model, processor, encoded, [PromptRow(0, prompt)], max_new_tokens=4, seg_masks="all")
    assert answer.text.startswith("[SEG]") and answer.num_seg >= 1
    assert len(answer.seg_masks) == len(answer.seg_prompts) == answer.num_seg
    assert all(mask.shape == (70, 100) and mask.dtype == torch.bool for mask in answer.seg_masks)
    answer_ids = torch.tensor([tokenizer.encode(answer.text, add_special_tokens=False)])
    full = torch.cat([ids, answer_ids], dim=1)
    hidden = model.llm_forward(full, torch.ones_like(full), pixels, grid[None]).hidden_states[-1][0]  # [L + T, D]
    seg_rows = (full[0] == model.seg_token_id).nonzero()[:, 0][:answer.num_seg]
    forced = model.seg_hidden_to_prompt(hidden[seg_rows])  # [num_seg, C_sam]
    torch.testing.assert_close(torch.stack(answer.seg_prompts), forced, atol=1e-5, rtol=1e-5)
    segmented = segment_texts(model, processor, encoded, ["the circle", ""], [0, 0], max_new_tokens=4,
                              seg_masks="first")  # the partner task "segment a text" on this family
    assert isinstance(segmented[0], Answer) and segmented[1] is None
    assert len(segmented[0].seg_masks) == min(1, segmented[0].num_seg)


def test_the_family_refuses_a_region_input(replica, tokenizer):
    _, model = replica
    processor = Sa2VAQwenProcessor.from_config(tokenizer, model.config)
    with pytest.raises(ValueError, match="no region"):
        processor.caption_prompt(4, torch.ones(2, 2, dtype=torch.bool))
    image = Image.new("RGB", (56, 56))
    with pytest.raises(ValueError, match="no region"):
        predict(model, processor, image, "<image>What is this?", region_mask=np.ones((56, 56), bool), max_new_tokens=2)


def test_images_are_pre_resized_to_28_px_multiples_before_the_qwen_processor(tokenizer):
    """upstream's qwen_vl_utils step: 70 x 100 px → 56 x 112 (nearest multiples of 28); then the processor's budget:
    with upstream's 512-token floor x 8 per side (448 x 896 = 32 x 64 patches of 14, 512 tokens), with a 4..16 token
    budget as it is (4 x 8 patches). Qwen3-VL's processor works in 32 px units: the 56 x 112 pre-resize gives 64 x 128
    (4 x 8 patches of 16), where the image as it is would give 64 x 96 (4 x 6)."""
    config = tiny_qwen_config("qwen2_5_vl")
    upstream_budget = Sa2VAQwenProcessor.from_config(tokenizer, config).preprocess_image(Image.new("RGB", (100, 70)))
    assert upstream_budget.image_grid_thw.tolist() == [1, 32, 64] and upstream_budget.n_tiles == 512
    small = Sa2VAQwenProcessor.from_config(tokenizer, config, min_pixels=4 * 28 * 28, max_pixels=16 * 28 * 28)
    inputs = small.preprocess_image(Image.new("RGB", (100, 70)))
    assert inputs.image_grid_thw.tolist() == [1, 4, 8] and inputs.n_tiles == 8 and inputs.size == (70, 100)
    assert tuple(inputs.g_pixel_values.shape) == (3, 256, 256)
    qwen3 = Sa2VAQwenProcessor.from_config(tokenizer, tiny_qwen_config("qwen3_vl"), min_pixels=4 * 28 * 28,
                                           max_pixels=16 * 28 * 28)
    assert qwen3.preprocess_image(Image.new("RGB", (100, 70))).image_grid_thw.tolist() == [1, 4, 8]


def test_lora_trains_the_upstream_set_and_exports_merged_into_upstreams_layout(replica, tokenizer, tmp_path):
    """LoRA on the text decoder's linears (upstream's SFT targets); the trainable set is LoRA + text_hidden_fcs + the
    SAM2 mask decoder (no mlp1 in this family); save_pretrained writes the merged weights under the plain layout,
    which loads back into the adapted model's outputs."""
    family, base = replica
    model = copy.deepcopy(base)
    model.apply_lora(r=4, lora_alpha=8, lora_dropout=0.0)
    trainable = configure_trainable(model)
    lora = [name for name in trainable if "lora_" in name]
    assert lora and all(".language_model.layers." in name for name in lora)
    assert not any(".visual." in name or "lm_head" in name for name in trainable)
    assert {name.split(".")[0] for name in trainable} == {"model", "text_hidden_fcs", "grounding_encoder"}
    assert all(".sam_mask_decoder." in name for name in trainable if name.startswith("grounding_encoder."))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name in lora:
            if "lora_B" in name:
                trainable[name].copy_(torch.randn(trainable[name].shape, generator=generator) * 0.05)
    inputs = reference_inputs(tokenizer, model.config)
    adapted, plain = our_outputs(model, tokenizer, inputs), our_outputs(base, tokenizer, inputs)
    assert (adapted["logits"] - plain["logits"]).abs().max() > 1e-3  # the adapters change the answer
    save_pretrained(model.eval(), tmp_path)
    assert checkpoint_layout(base) == checkpoint_layout(load_pretrained(tmp_path))
    exported = our_outputs(load_pretrained(tmp_path, attn_implementation="eager"), tokenizer, inputs)
    for key in adapted:
        torch.testing.assert_close(exported[key], adapted[key], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_checkpoint_directory_loads_with_its_processor_and_predicts_as_upstreams_predict_forward(family, tmp_path):
    """Upstream's own predict_forward (chat template, qwen_vl_utils resize, transformers processor, generate, [SEG]
    state → SAM2 → mask at image size) on the replica whose head answers ``[SEG]<|im_end|>`` gave the pinned answer
    and mask. Saved as upstream's converter leaves a checkpoint (weights + config.json, and the processor beside them:
    tokenizer with its chat template, image processor), the evaluation loader builds the model and the processor from
    that directory alone, and our predict gives the same answer and the same mask, pixel for pixel, with upstream's
    decoder (``generate``) and with the fast decoder."""
    from projects.llava_sam2.rl_train.evaluation.loading import load_system

    tokenizer = tiny_qwen_tokenizer()
    save_pretrained(seg_then_stop_model(family, tokenizer), tmp_path)
    tiny_qwen_hf_processor(family, tokenizer).save_pretrained(str(tmp_path))
    model, processor, meta = load_system(checkpoint=str(tmp_path))
    assert isinstance(model, Sa2VAQwenModel) and isinstance(processor, Sa2VAQwenProcessor)
    assert processor.tokenizer.chat_template and meta["source"] == f"checkpoint {tmp_path}"
    with safe_open(str(DATA / f"qwen_vl_upstream_predict_{family}.safetensors"), framework="pt") as handle:
        expected_text = handle.metadata()["prediction"]
        expected_masks = handle.get_tensor("masks").bool().numpy()  # [n_seg, H, W]
    assert expected_text == "[SEG]<|im_end|>"
    assert expected_masks.any() and expected_masks.shape == (1, *PREDICT_IMAGE_SIZE)
    for decode_backend in ("reference", "fast"):  # predict's default (generate), and the fast decoder
        result = predict(model, processor, predict_image(), PREDICT_TEXT, decode_backend=decode_backend)
        assert result["prediction"] == expected_text, decode_backend
        assert np.array_equal(np.stack(result["prediction_masks"]), expected_masks), decode_backend


def test_loop_1s_region_input_is_the_region_drawn_into_the_image(replica, tokenizer, monkeypatch):
    """describe_masks on this family: the mask's outline is painted red into a copy of the image (pixels within the
    outline width of the outside; nothing else changes), and the decoder is given that copy's vision inputs (not the
    original's) with the outline-naming question; empty or missing masks get no caption."""
    _, model = replica
    model.bind_tokenizer(tokenizer)
    processor = Sa2VAQwenProcessor.from_config(tokenizer, model.config, min_pixels=4 * 28 * 28, max_pixels=16 * 28 * 28)
    image = Image.fromarray((np.random.default_rng(1).random((70, 100, 3)) * 255).astype(np.uint8))
    region = np.zeros((70, 100), bool)
    region[10:50, 20:80] = True
    drawn = np.asarray(processor.region_outline.draw(image, region))
    changed = (drawn != np.asarray(image)).any(-1)  # [H, W]
    width = 2  # max(2, 1% of 100 px)
    outline = region.copy()
    outline[10 + width:50 - width, 20 + width:80 - width] = False
    assert not (changed & ~outline).any() and (drawn[outline] == (255, 0, 0)).all()
    seen = []  # per decode call: the pixels the vision tower is given, the prompt ids and grids placed
    qwen = model.hf_model.model
    image_features, rope_index = qwen.get_image_features, qwen.get_rope_index

    def recording_image_features(pixel_values, image_grid_thw):
        seen.append({"pixel_values": pixel_values})
        return image_features(pixel_values, image_grid_thw)

    def recording_rope_index(**kwargs):
        seen[-1].update(kwargs)
        return rope_index(**kwargs)

    monkeypatch.setattr(qwen, "get_image_features", recording_image_features)
    monkeypatch.setattr(qwen, "get_rope_index", recording_rope_index)
    encoded = encode_images(model, processor, [image], ["image 0"])
    described = describe_masks(model, processor, encoded, [region, None, np.zeros_like(region)], [0, 0, 0],
                               ["s0", "s1", "s2"], max_new_tokens=4, empty_region=None)
    assert described[1] is None and described[2] is None and len(seen) == 1
    assert described[0].is_drawn and described[0].region_tokens == 0
    with pytest.raises(ValueError, match="no native region input"):  # upstream never trained its region tokens
        describe_masks(model, processor, encoded, [region], [0], ["s0"], max_new_tokens=4, empty_region=None,
                       region_input="native")
    assert torch.equal(described[0].region_cells, torch.from_numpy(region)) and described[0].answer.num_tokens > 0
    expected = processor.preprocess_image(Image.fromarray(drawn))
    assert torch.equal(seen[0]["pixel_values"], expected.pixel_values)
    assert seen[0]["image_grid_thw"].tolist() == [expected.image_grid_thw.tolist()]
    prompt = tokenizer.decode(seen[0]["input_ids"][0])
    assert prompt == processor.region_outline.caption_prompt(processor, expected.n_tiles) and "outlined in red" in prompt
