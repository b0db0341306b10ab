"""Checkpoint I/O: bit-exact round trips (single file, sharded, InternLM2 names, merged LoRA, tied head)
and clear errors for bad configs, wrong key layouts and corrupt safetensors."""
from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from projects.llava_sam2.rl_train.model.checkpoints.dtypes import DTYPES, as_torch_dtype
from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import (checkpoint_layout, checkpoint_state_dict,
                                                                        load_pretrained, parse_size, save_pretrained)
from projects.llava_sam2.rl_train.model.network.configuration import SUPPORTED_LLM_ARCHITECTURES, Sa2VAConfig
from projects.llava_sam2.rl_train.model.network.language import LanguageKeyMap
from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel

VOCAB = 96
G_WEIGHT = "grounding_encoder.sam2_model.memory_encoder.fuser.layers.0.g_weight"


def tiny_model(config: Sa2VAConfig | None = None) -> Sa2VAModel:
    torch.manual_seed(0)
    return Sa2VAModel(config or build_preset("tiny", vocab_size=VOCAB))


def internlm2_config() -> Sa2VAConfig:
    data = build_preset("tiny", vocab_size=VOCAB).to_dict()
    data["template"] = "internlm2_chat"
    data["llm_config"] = {
        "architectures": ["InternLM2ForCausalLM"], "model_type": "internlm2", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
        "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "bias": False,
        "max_position_embeddings": 512, "attn_implementation": "eager", "auto_map": {"AutoConfig": "x.y"},
    }
    return Sa2VAConfig.from_dict(data)


def assert_same_tensors(a: Sa2VAModel, b: Sa2VAModel) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype, key
        assert torch.equal(sa[key], sb[key]), f"{key} changed in the round trip"


def file_layout(path) -> dict[str, tuple[int, ...]]:
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            out.update({k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()})
    return out


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    model = tiny_model()
    path = tmp_path_factory.mktemp("tiny")
    save_pretrained(model, path)
    return model, path


# ---------------------------------------------------------------------------------------------- round trips
def test_round_trip_is_bit_exact(saved_tiny):
    model, path = saved_tiny
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]
    loaded = load_pretrained(path)
    assert_same_tensors(model, loaded)
    assert loaded.config == model.config and loaded.config.to_dict() == model.config.to_dict()
    assert file_layout(path) == checkpoint_layout(model)  # what we write is what the layout says


def test_sam2_gamma_is_saved_as_g_weight(saved_tiny):
    model, path = saved_tiny
    names = set(file_layout(path))
    assert G_WEIGHT in names and not any(k.endswith(".gamma") for k in names)
    stored = load_file(str(path / "model.safetensors"))[G_WEIGHT]
    assert torch.equal(stored, model.grounding_encoder.sam2_model.memory_encoder.fuser.layers[0].gamma)


def test_sharded_round_trip(tmp_path):
    model = tiny_model()
    save_pretrained(model, tmp_path, max_shard_size="300KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1 and set(index["weight_map"].values()) == set(shards)
    assert not (tmp_path / "model.safetensors").exists()
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in model.state_dict().values()
                                                  if t.is_floating_point())
    assert_same_tensors(model, load_pretrained(tmp_path))


def test_bf16_checkpoint_loads_in_bf16_by_default(tmp_path):
    model = tiny_model().to(torch.bfloat16)
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path)
    assert loaded.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in loaded.parameters())
    assert loaded.language_model.model.rotary_emb.inv_freq.dtype == torch.float32  # RoPE table stays fp32
    assert_same_tensors(model, loaded)
    assert load_pretrained(tmp_path, torch_dtype=torch.float32).dtype == torch.float32


def test_loaders_take_a_dtype_by_name_from_the_one_table(tmp_path):
    """Configs and command lines name dtypes as text: the loaders read those names from one table (dtypes.DTYPES),
    the same one the CLI offers as choices."""
    from projects.llava_sam2.rl_train.cli import evaluate, setup_checkpoint

    save_pretrained(tiny_model(), tmp_path / "fp32")
    assert load_pretrained(tmp_path / "fp32", torch_dtype="bfloat16").dtype == torch.bfloat16
    setup_checkpoint.make_tiny_checkpoint(tmp_path / "bf16", dtype="bfloat16")
    assert load_pretrained(tmp_path / "bf16").dtype == torch.bfloat16
    assert as_torch_dtype("float16") is torch.float16 and as_torch_dtype(torch.float32) is torch.float32
    assert as_torch_dtype(None) is None
    with pytest.raises(ValueError, match=r"torch_dtype='bf16' is not a dtype name; use one of \['bfloat16'"):
        load_pretrained(tmp_path / "fp32", torch_dtype="bf16")
    assert setup_checkpoint.DTYPES is DTYPES and evaluate.DTYPES is DTYPES  # their --dtype choices


def test_unknown_config_keys_survive(tmp_path):
    data = build_preset("tiny", vocab_size=VOCAB).to_dict()
    data["system_message"] = "keep me"
    data["llm_config"]["some_future_key"] = [1, 2]
    data["template"] = "qwen-chat"
    config = Sa2VAConfig.from_dict(data)
    assert config.template == "qwen_chat"
    out = config.to_dict()
    assert out["system_message"] == "keep me" and out["llm_config"]["some_future_key"] == [1, 2]
    config.to_json_file(tmp_path / "config.json")
    assert Sa2VAConfig.from_json_file(tmp_path / "config.json") == config


def test_internlm2_names_and_wqkv_split_per_kv_group(tmp_path):
    model = tiny_model(internlm2_config())
    save_pretrained(model, tmp_path)
    stored = load_file(str(tmp_path / "model.safetensors"))
    lm = {k[len("language_model."):]: v for k, v in stored.items() if k.startswith("language_model.")}
    assert {"model.tok_embeddings.weight", "output.weight", "model.layers.0.attention.wqkv.weight",
            "model.layers.0.feed_forward.w2.weight", "model.layers.1.ffn_norm.weight"} <= set(lm)
    assert not any("q_proj" in k or "embed_tokens" in k or "lm_head" in k for k in lm)
    # InternLM2 attention: qkv = x W_qkvᵀ viewed as (heads_kv, g + 2, head_dim); the first g are the
    # query heads of that group, then one key and one value head.
    n_kv, g, hd, D = 2, 2, 16, 64
    x = torch.randn(5, D)
    fused = (x @ lm["model.layers.0.attention.wqkv.weight"].T).view(5, n_kv, g + 2, hd)
    attn = model.language_model.model.layers[0].self_attn
    assert torch.allclose(attn.q_proj(x).view(5, n_kv * g, hd), fused[:, :, :g].reshape(5, n_kv * g, hd))
    assert torch.allclose(attn.k_proj(x).view(5, n_kv, hd), fused[:, :, g])
    assert torch.allclose(attn.v_proj(x).view(5, n_kv, hd), fused[:, :, g + 1])
    loaded = load_pretrained(tmp_path)
    assert_same_tensors(model, loaded)
    assert loaded.config.llm_config.auto_map == {"AutoConfig": "x.y"}


def test_wqkv_split_and_fuse_are_inverse():
    key_map = LanguageKeyMap(internlm2_config().llm_config)
    wqkv = torch.arange(2 * 4 * 16 * 3, dtype=torch.float32).reshape(2 * 4 * 16, 3)  # rows (kv, g+2, hd)
    q, k, v = key_map.split_wqkv(wqkv)
    assert q.shape == (64, 3) and k.shape == (32, 3) and v.shape == (32, 3)
    assert torch.equal(q[16:32], wqkv[16:32]) and torch.equal(q[32:48], wqkv[64:80])  # group 1 starts at row 64
    assert torch.equal(k[:16], wqkv[32:48]) and torch.equal(v[16:32], wqkv[112:128])
    assert torch.equal(key_map.fuse_wqkv(q, k, v), wqkv)


def test_peft_model_is_saved_merged_without_touching_it(tmp_path):
    model = tiny_model()
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                      modules_to_save=["lm_head"], task_type="CAUSAL_LM")
    model.language_model = get_peft_model(model.language_model, lora)
    base = model.language_model.get_base_model()
    q_proj = base.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        q_proj.lora_B["default"].weight.normal_()
        base.lm_head.modules_to_save["default"].weight.add_(1.0)
    w_before = q_proj.base_layer.weight.detach().clone()
    save_pretrained(model, tmp_path)
    assert torch.equal(q_proj.base_layer.weight, w_before) and not q_proj.merged  # live model untouched
    stored = load_file(str(tmp_path / "model.safetensors"))
    expected = w_before + 2.0 * q_proj.lora_B["default"].weight @ q_proj.lora_A["default"].weight  # α/r = 2
    assert torch.equal(stored["language_model.model.layers.0.self_attn.q_proj.weight"], expected)
    assert torch.equal(stored["language_model.lm_head.weight"], base.lm_head.modules_to_save["default"].weight)
    assert set(stored) == set(checkpoint_layout(tiny_model()))  # plain upstream names only
    loaded = load_pretrained(tmp_path)
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        assert torch.allclose(loaded.language_model(ids).logits, model.language_model(ids).logits, atol=1e-5)


def test_checkpoint_without_lm_head_ties_it(tmp_path):
    model = tiny_model()
    save_pretrained(model, tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["language_model.lm_head.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    loaded = load_pretrained(tmp_path)
    assert loaded.lm_head_tied
    assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
    assert "language_model.lm_head.weight" not in checkpoint_state_dict(loaded)
    save_pretrained(loaded, tmp_path / "again")
    assert load_file(str(tmp_path / "again" / "model.safetensors")).keys() == state.keys()


# ---------------------------------------------------------------------------------------------- bad input
def test_unknown_llm_architecture_lists_supported(tmp_path):
    data = build_preset("tiny", vocab_size=VOCAB).to_dict()
    data["llm_config"]["architectures"] = ["MambaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="MambaForCausalLM") as err:
        load_pretrained(tmp_path)
    assert all(arch in str(err.value) for arch in SUPPORTED_LLM_ARCHITECTURES)
    assert str(tmp_path / "config.json") in str(err.value)


def test_wrong_key_layout_lists_missing_unexpected_and_shapes(saved_tiny, tmp_path):
    model, path = saved_tiny
    state = load_file(str(path / "model.safetensors"))
    state["mlp1.1.weightt"] = state.pop("mlp1.1.weight")
    state["text_hidden_fcs.9.bias"] = torch.zeros(3)
    state["mlp1.3.bias"] = torch.zeros(5)
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(ValueError) as err:
        load_pretrained(tmp_path)
    message = str(err.value)
    assert "missing (1)" in message and "mlp1.1.weight\n" in message + "\n"
    assert "unexpected (2)" in message and "mlp1.1.weightt" in message and "text_hidden_fcs.9.bias" in message
    assert "shape mismatch (1)" in message and "mlp1.3.bias: checkpoint (5,) vs model (128,)" in message


def test_truncated_safetensors_names_the_file(saved_tiny, tmp_path):
    _, path = saved_tiny
    data = (path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(ValueError, match="model.safetensors.*corrupt or truncated"):
        load_pretrained(tmp_path)


def test_missing_files_are_named(saved_tiny, tmp_path):
    _, path = saved_tiny
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-1.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="model-1.safetensors"):
        load_pretrained(tmp_path)


def test_parse_size():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("300KB") == 300_000 and parse_size(17) == 17
    with pytest.raises(ValueError, match="max_shard_size"):
        parse_size("lots")


def test_make_tiny_checkpoint_tool_is_seeded_and_loadable(tmp_path):
    from transformers import AutoTokenizer

    from projects.llava_sam2.rl_train.cli import setup_checkpoint as tool

    tool.main([str(tmp_path / "a"), "--seed", "1"])
    tool.make_tiny_checkpoint(tmp_path / "b", seed=1)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    model = load_pretrained(tmp_path / "a")
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "a"))
    model.bind_tokenizer(tokenizer)
    assert model.config.vocab_size == len(tokenizer) and model.config.template == "qwen_chat"
