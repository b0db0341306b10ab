"""The Qwen-VL family (Sa2VA-Qwen2.5-VL-3B/7B, Sa2VA-Qwen3-VL-4B, upstream codebase v2's ``Sa2VAChatModelQwen``):
presets of the released sizes, the HF layout round trip of tiny Qwen2.5-VL and Qwen3-VL replicas, and parity with
upstream's own HF code in both directions, pinned as data (docs/upstream.md, "The Qwen-VL family").

Needs transformers >= 4.57 (Qwen3-VL; Qwen2.5-VL alone would need 4.49): skipped on an older stack."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", minversion="4.57")  # Qwen3VLForConditionalGeneration; reason in the docstring

from safetensors.torch import load_file, save_file  # noqa: E402

from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import (  # noqa: E402
    checkpoint_layout, checkpoint_state_dict, load_pretrained, save_pretrained)
from projects.llava_sam2.rl_train.model.network import qwen_vl  # noqa: E402
from projects.llava_sam2.rl_train.model.network.presets import build_preset  # noqa: E402
from projects.llava_sam2.rl_train.model.network.qwen_vl import Sa2VAQwenConfig, Sa2VAQwenModel  # noqa: E402
from qwen_vl_fixtures import (FAMILIES, our_outputs, pinned_outputs, reference_inputs, tiny_qwen_config,  # noqa: E402
                              tiny_qwen_model, tiny_qwen_tokenizer)

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
