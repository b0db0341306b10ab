"""Meta-device builds of the real presets produce exactly the upstream checkpoint key names and shapes."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import checkpoint_layout
from projects.llava_sam2.rl_train.model.network.configuration import Sa2VAConfig
from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
import expected_layouts as E


def meta_layout(config: Sa2VAConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = Sa2VAModel(config)
    assert all(p.is_meta for p in model.parameters())
    return checkpoint_layout(model)


# in3_8b stands for the InternVL3 family (one more Qwen2 layout; test_internvl3.py checks every in3 size's dims)
@pytest.fixture(scope="module", params=["1b", "4b", "8b", "in3_8b"])
def release_layout(request):
    return request.param, meta_layout(build_preset(request.param))


def test_exact_key_set_per_group(release_layout):
    release, layout = release_layout
    keys = set(layout)
    groups = {
        "vision_model": E.vit_300m_keys(),
        "language_model": E.llm_keys(release),
        "projectors": E.projector_keys(),
    }
    assert {k for k in keys if k.startswith(E.VIT)} == groups["vision_model"]
    assert {k for k in keys if k.startswith(E.LM)} == groups["language_model"]
    assert {k for k in keys if k.startswith(("mlp1.", "text_hidden_fcs."))} == groups["projectors"]
    for spelled in (E.sam2_image_encoder_keys(), E.sam2_mask_decoder_keys(), E.sam2_prompt_encoder_keys()):
        prefix = next(iter(spelled)).split(".")[2]  # image_encoder / sam_mask_decoder / sam_prompt_encoder
        assert {k for k in keys if k.split(".")[2] == prefix} == spelled, prefix
    assert E.sam2_named_keys() <= keys
    assert not [k for k in keys if k.endswith(".gamma")]  # HF name is g_weight


def test_tensor_counts(release_layout):
    release, layout = release_layout
    top = Counter(k.split(".")[0] for k in layout)
    r = E.RELEASES[release]
    per_layer = 12 if r["arch"] == "Qwen2ForCausalLM" else 7
    assert top["vision_model"] == E.VIT_300M_TENSORS
    assert top["language_model"] == per_layer * r["layers"] + 3
    assert top["mlp1"] == E.MLP1_TENSORS and top["text_hidden_fcs"] == E.TEXT_HIDDEN_FCS_TENSORS
    assert top["grounding_encoder"] == E.SAM2_TENSORS
    sam = Counter(k.split(".")[2] for k in layout if k.startswith(E.SAM))
    assert dict(sam) == E.SAM2_GROUP_COUNTS
    assert len(layout) == sum(top.values()) and set(top) == {
        "vision_model", "language_model", "mlp1", "grounding_encoder", "text_hidden_fcs"}


def test_representative_shapes(release_layout):
    release, layout = release_layout
    expected = E.representative_shapes(release)
    wrong = {k: (layout.get(k), v) for k, v in expected.items() if layout.get(k) != v}
    assert not wrong, f"{release}: (ours, reference) differ for {wrong}"


def test_checkpoint_order_follows_the_state_dict():
    layout = meta_layout(build_preset("1b"))
    firsts = list(dict.fromkeys(k.split(".")[0] for k in layout))
    assert firsts == ["vision_model", "language_model", "mlp1", "grounding_encoder", "text_hidden_fcs"]


def test_phi3_and_llama_build_with_their_own_key_names():
    base = build_preset("tiny", vocab_size=64).to_dict()
    llm = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=64, vocab_size=64, pad_token_id=0)
    for arch, expect in (("Phi3ForCausalLM", ("self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight")),
                         ("LlamaForCausalLM", ("self_attn.q_proj.weight", "mlp.gate_proj.weight"))):
        base["llm_config"] = {**llm, "architectures": [arch]}
        layout = meta_layout(Sa2VAConfig.from_dict(base))
        for suffix in expect:
            assert f"language_model.model.layers.0.{suffix}" in layout, (arch, suffix)
        assert layout["mlp1.1.weight"] == (32, 256) and layout["text_hidden_fcs.2.weight"] == (32, 32)


def test_lora_wrapped_meta_model_keeps_the_upstream_layout():
    from projects.llava_sam2.rl_train.model.network.lora import apply_lora

    with torch.device("meta"):
        model = Sa2VAModel(build_preset("8b"))
        plain = checkpoint_layout(model)
        model.language_model = apply_lora(model.language_model, r=8, lora_alpha=16)
    wrapped = checkpoint_layout(model)  # LoRA merged into W on meta: names and shapes unchanged
    assert wrapped == plain
    assert any(".lora_A." in n for n, _ in model.named_parameters())
