"""The InternVL3 family (Sa2VA-InternVL3-2B/8B/14B, upstream codebase v2): presets, the HF layout round trip of a
tiny replica in that family's config.json shape, the template it names, the config fields upstream's v2 reader
needs (docs/sa2va_internals.md §9), and parity with upstream's own v2 HF code in both directions, pinned as data
(docs/upstream.md, "Parity with upstream's HF code")."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from xtuner.utils import PROMPT_TEMPLATE

from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import (checkpoint_layout, checkpoint_state_dict,
                                                                        load_pretrained, save_pretrained)
from projects.llava_sam2.rl_train.model.network.configuration import Sa2VAConfig
from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer
from internvl3_fixtures import (INTERNVL3_LLM_EXTRAS, INTERNVL3_TOP_LEVEL_EXTRAS, INTERNVL3_VISION_EXTRAS,
                                our_outputs, pinned_outputs, reference_inputs, tiny_internvl3_config,
                                tiny_internvl3_model)

DATA = Path(__file__).resolve().parent / "data"
# upstream's outputs on the replica (its forward over our saved checkpoint) and what its save_pretrained wrote
# (the Qwen2.5 replica's, written under transformers 4.48 as the released checkpoints were; the Qwen3 replica's under
# 4.57, which Qwen3 needs)
LLMS = ("qwen2", "qwen3", "qwen3_tied")  # internvl3_fixtures.LLM_PRESETS
UPSTREAM_REFERENCE = {llm: DATA / f"internvl3{'' if llm == 'qwen2' else '_' + llm}_upstream_reference.safetensors"
                      for llm in LLMS}
UPSTREAM_SAVED = {llm: DATA / f"internvl3{'' if llm == 'qwen2' else '_' + llm}_upstream_saved.json" for llm in LLMS}
PARITY_TOLERANCE = 1e-5  # max |ours - upstream|, fp32


@pytest.fixture(scope="module")
def tokenizer():
    return load_tiny_tokenizer()


@pytest.fixture(scope="module")
def saved_replica(tmp_path_factory):
    model = tiny_internvl3_model()
    path = tmp_path_factory.mktemp("in3")
    save_pretrained(model, path)
    return model, path


# Qwen2.5-1.5B / -7B / -14B: hidden, layers, heads, kv heads, FFN (docs/sa2va_internals.md §9.1)
@pytest.mark.parametrize("name, dims", [("in3_2b", (1536, 28, 12, 2, 8960)), ("in3_8b", (3584, 28, 28, 4, 18944)),
                                        ("in3_14b", (5120, 48, 40, 8, 13824))])
def test_internvl3_presets_pair_internvit_300m_with_qwen25_and_qwen_chat(name, dims):
    config = build_preset(name)
    llm = config.llm_config
    assert config.llm_architecture == "Qwen2ForCausalLM"
    assert (llm.hidden_size, llm.num_hidden_layers, llm.num_attention_heads, llm.num_key_value_heads,
            llm.intermediate_size) == dims
    assert config.vit_hidden_size == 1024 and config.num_image_token == 256 and config.vocab_size == 151679
    assert config.template == "qwen_chat"
    assert config.llm_config.rope_scaling == {"factor": 2.0, "rope_type": "dynamic", "type": "dynamic"}


def test_tiny_internvl3_replica_round_trips_bit_exactly(saved_replica, tokenizer):
    model, path = saved_replica
    loaded = load_pretrained(path, attn_implementation="eager")  # as the replica: same kernels, equal outputs
    assert loaded.config == model.config
    saved, ours = loaded.state_dict(), model.state_dict()
    assert saved.keys() == ours.keys()
    changed = [k for k in ours if not torch.equal(ours[k], saved[k])]
    assert not changed, f"changed in the round trip: {changed[:5]}"
    written = json.loads((path / "config.json").read_text())
    assert {k: written[k] for k in INTERNVL3_TOP_LEVEL_EXTRAS} == INTERNVL3_TOP_LEVEL_EXTRAS
    assert {k: written["llm_config"][k] for k in INTERNVL3_LLM_EXTRAS} == INTERNVL3_LLM_EXTRAS
    assert {k: written["vision_config"][k] for k in INTERNVL3_VISION_EXTRAS} == INTERNVL3_VISION_EXTRAS
    assert written["template"] == "qwen_chat" and written["model_type"] == "sa2va_chat"
    inputs = reference_inputs(tokenizer, model.config)
    before, after = our_outputs(model, tokenizer, inputs), our_outputs(loaded, tokenizer, inputs)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_the_processor_follows_the_template_the_checkpoint_names(saved_replica, tokenizer):
    _, path = saved_replica
    qwen = Sa2VAProcessor.from_config(tokenizer, load_pretrained(path).config)
    assert qwen.template_user_turn("hi") == PROMPT_TEMPLATE.qwen_chat.INSTRUCTION.format(input="hi", round=1)
    config = json.loads((path / "config.json").read_text())
    config["template"] = "internlm2_chat"
    other = Sa2VAProcessor.from_config(tokenizer, Sa2VAConfig.from_dict(config))
    assert other.template_user_turn("hi") == PROMPT_TEMPLATE.internlm2_chat.INSTRUCTION.format(input="hi", round=1)
    config["template"] = "internvl2_5"  # what the InternVL3 base model's config.json says
    with pytest.raises(ValueError, match="InternVL base model's, not a Sa2VA checkpoint's"):
        Sa2VAProcessor.from_config(tokenizer, Sa2VAConfig.from_dict(config))


def test_the_rl_step_benchmark_offers_the_internvl3_presets():
    from projects.llava_sam2.rl_train.benchmarks.rl_step import parse_args

    assert parse_args(["--preset", "in3_8b"]).preset == "in3_8b"


def test_saved_config_json_has_the_class_fields_upstream_v2_reads(tmp_path):
    """Upstream's v2 config reader builds a Qwen2.5-VL model when top-level ``architectures`` is missing and drops a
    ``vision_config`` without ``architectures``: a config that lacks them (one the v1 reader accepted) gains them."""
    data = tiny_internvl3_config().to_dict()
    for key in ("architectures", "auto_map"):
        data.pop(key)
    data["vision_config"].pop("architectures")
    torch.manual_seed(0)
    model = tiny_internvl3_model()
    model.config = Sa2VAConfig.from_dict(data)
    save_pretrained(model, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == ["Sa2VAChatModel"]
    assert written["vision_config"]["architectures"] == ["InternVisionModel"]
    assert written["auto_map"]["AutoModel"] == "modeling_sa2va_chat.Sa2VAChatModel"


def test_a_qwen3_llm_builds_qwen3_blocks_with_its_own_head_size():
    model = tiny_internvl3_model(llm="qwen3")
    attention = model.language_model.model.layers[0].self_attn
    assert type(model.language_model).__name__ == "Qwen3ForCausalLM" and model.config.template == "qwen_chat"
    assert attention.q_proj.out_features == 4 * 48 and attention.q_norm.weight.shape == (48,)  # head_dim 48, not 32


def assert_matches_upstream(model: Sa2VAModel, tokenizer, llm: str = "qwen2") -> None:
    inputs = reference_inputs(tokenizer, model.config)
    ours = pinned_outputs(our_outputs(model, tokenizer, inputs), tokenizer, inputs)
    reference = load_file(str(UPSTREAM_REFERENCE[llm]))
    assert set(reference) == {"logits", "seg_prompt", "mask_logits"}
    for key, expected in reference.items():
        assert ours[key].shape == expected.shape, key
        err = (ours[key] - expected).abs().max().item()
        assert err <= PARITY_TOLERANCE, f"{key}: max |ours - upstream| = {err:.2e} > {PARITY_TOLERANCE}"


@pytest.mark.parametrize("llm", LLMS)
def test_our_checkpoint_gives_upstream_v2_code_our_outputs(tokenizer, llm):
    """Direction A: upstream's Sa2VAChatModel loaded our save_pretrained of the replica strictly; its forward (LLM
    logits, [SEG] prompt, mask logits) is pinned, and ours on the same weights and input matches it."""
    assert_matches_upstream(tiny_internvl3_model(llm=llm), tokenizer, llm)


@pytest.mark.parametrize("llm", LLMS)
def test_a_checkpoint_upstream_v2_code_saved_loads_here_with_its_outputs(tokenizer, tmp_path, llm):
    """Direction B: upstream's save_pretrained of the replica wrote the config.json and key layout pinned here; we
    read that config.json, build exactly that layout, and the replica's weights under those names give upstream's
    outputs. With tied embeddings upstream writes no LM head: we tie it to the input embeddings at load."""
    saved = json.loads(UPSTREAM_SAVED[llm].read_text())
    assert saved["config"]["llm_config"]["architectures"] == [f"{llm.split('_')[0].capitalize()}ForCausalLM"]
    is_tied = llm == "qwen3_tied"
    head = "language_model.lm_head.weight"
    assert (head not in saved["layout"]) == is_tied
    with torch.device("meta"):
        layout = checkpoint_layout(Sa2VAModel(Sa2VAConfig.from_dict(saved["config"])))
    assert {key: shape for key, shape in layout.items() if not (is_tied and key == head)} == \
        {key: tuple(shape) for key, shape in saved["layout"].items()}
    (tmp_path / "config.json").write_text(json.dumps(saved["config"]))
    state = {key: value for key, value in checkpoint_state_dict(tiny_internvl3_model(llm=llm)).items()
             if key in saved["layout"]}
    save_file(state, str(tmp_path / "model.safetensors"))
    model = load_pretrained(tmp_path, attn_implementation="eager")
    assert model.lm_head_tied == is_tied
    assert checkpoint_layout(model) == {key: tuple(shape) for key, shape in saved["layout"].items()}  # saved alike
    assert model.config.template == "qwen_chat"
    assert_matches_upstream(model, tokenizer, llm)
