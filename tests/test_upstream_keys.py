"""Unit tests of the upstream (XTuner) key map, the DeepSpeed ZeRO reader and the load helpers (issue #16); no
fixture run needed. Expected values are derived by hand in the comments."""
from __future__ import annotations

import pickle
import sys
import types

import pytest
import torch

from projects.llava_sam2.rl_train.model.checkpoints.deepspeed_zero import _load, _merge_zero2, _merge_zero3, read_zero_checkpoint
from projects.llava_sam2.rl_train.model.checkpoints.upstream_convert import apply_hf_dtype
from projects.llava_sam2.rl_train.model.checkpoints.xtuner_checkpoint import LoadReport, _fit_rows, resolve_layout, xtuner_state_dict
from projects.llava_sam2.rl_train.model.checkpoints.xtuner_keys import (is_upstream_checkpoint_key, lora_to_module,
                                                            module_lora_targets, parse_upstream_state, upstream_key)
from projects.llava_sam2.rl_train.model.network.configuration import SubConfig
from projects.llava_sam2.rl_train.model.network.language import LanguageKeyMap
from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel

LLM = "mllm.model.language_model.base_model.model."


def test_upstream_names_map_to_hf_names_and_back():
    pairs = {  # upstream training name -> HF checkpoint name (convert_to_hf.py: drop 'mllm.model.', gamma->g_weight)
        LLM + "model.layers.0.self_attn.q_proj.base_layer.weight":
            "language_model.model.layers.0.self_attn.q_proj.weight",
        LLM + "model.layers.0.self_attn.q_proj.base_layer.bias": "language_model.model.layers.0.self_attn.q_proj.bias",
        LLM + "model.norm.weight": "language_model.model.norm.weight",
        LLM + "lm_head.weight": "language_model.lm_head.weight",
        "mllm.model.vision_model.encoder.layers.0.ls1": "vision_model.encoder.layers.0.ls1",
        "mllm.model.mlp1.0.weight": "mlp1.0.weight",
        "grounding_encoder.sam2_model.memory_encoder.fuser.layers.1.gamma":
            "grounding_encoder.sam2_model.memory_encoder.fuser.layers.1.g_weight",
        "text_hidden_fcs.2.bias": "text_hidden_fcs.2.bias",
    }
    parsed = parse_upstream_state({k: torch.zeros(1) for k in pairs})
    assert set(parsed.weights) == set(pairs.values()) and parsed.is_llm_wrapped
    targets = {"q_proj", "k_proj"}
    for upstream, hf in pairs.items():
        assert upstream_key(hf, is_llm_wrapped=True, lora_targets=targets) == upstream
    # an SFT run without llm_lora has no peft prefix
    assert upstream_key("language_model.model.norm.weight", is_llm_wrapped=False) == \
        "mllm.model.language_model.model.norm.weight"


def test_lora_tensors_are_split_out_and_half_pairs_rejected():
    layer = "model.layers.1.mlp.down_proj"
    state = {f"{LLM}{layer}.lora_A.default.weight": torch.ones(2, 3),
             f"{LLM}{layer}.lora_B.default.weight": torch.ones(4, 2)}
    parsed = parse_upstream_state(state)
    assert parsed.weights == {} and parsed.lora_A[layer].shape == (2, 3) and parsed.lora_B[layer].shape == (4, 2)
    with pytest.raises(ValueError, match="only one of lora_A / lora_B"):
        parse_upstream_state({f"{LLM}{layer}.lora_A.default.weight": torch.ones(2, 3)})
    with pytest.raises(ValueError, match="1 keys do not map(.|\n)*lora_A.other"):
        parse_upstream_state({f"{LLM}{layer}.lora_A.other.weight": torch.ones(2, 3)})


def test_upstream_state_dict_filter_keeps_the_trained_subset():
    # llava_sam2.py state_dict: LoRA, mlp1, mask decoder, text_hidden_fcs, LM head / InternLM2 'output', embeddings
    kept = [LLM + "model.layers.0.self_attn.q_proj.lora_A.default.weight", "mllm.model.mlp1.1.weight",
            "grounding_encoder.sam2_model.sam_mask_decoder.iou_token.weight", "text_hidden_fcs.0.weight",
            LLM + "lm_head.weight", LLM + "model.embed_tokens.weight", LLM + "output.base_layer.weight"]
    dropped = [LLM + "model.layers.0.self_attn.q_proj.base_layer.weight",
               "mllm.model.vision_model.encoder.layers.0.ls1",
               "grounding_encoder.sam2_model.image_encoder.trunk.pos_embed",
               "grounding_encoder.sam2_model.obj_ptr_proj.layers.0.weight"]
    assert all(is_upstream_checkpoint_key(k) for k in kept)
    assert not any(is_upstream_checkpoint_key(k) for k in dropped)


def test_internlm2_wqkv_adapter_splits_exactly():
    """ΔW = B A with B's rows grouped like wqkv: q/k/v adapters (shared A, B rows split) give split(W + s B A)."""
    torch.manual_seed(0)
    cfg = SubConfig({"architectures": ["InternLM2ForCausalLM"], "num_attention_heads": 4, "num_key_value_heads": 2,
                     "hidden_size": 16}, {}, "llm_config")
    lm_map = LanguageKeyMap(cfg)  # head_dim 4, 2 KV groups of (2 q heads + k + v) -> wqkv has 2*4*4 = 32 rows
    weight, lora_a, lora_b, scale = torch.randn(32, 16), torch.randn(3, 16), torch.randn(32, 3), 2.0
    parsed = parse_upstream_state({f"{LLM}model.layers.0.attention.wqkv.lora_A.default.weight": lora_a,
                                   f"{LLM}model.layers.0.attention.wqkv.lora_B.default.weight": lora_b})
    layers = lora_to_module(parsed, lm_map)
    expected = lm_map.split_wqkv(weight + scale * lora_b @ lora_a)
    for name, full in zip("qkv", expected):
        a, b = layers[f"model.layers.0.self_attn.{name}_proj"]
        base = lm_map.split_wqkv(weight)["qkv".index(name)]
        assert torch.allclose(base + scale * b @ a, full, atol=1e-5), name
    assert module_lora_targets("InternLM2ForCausalLM", ("wqkv", "wo", "w1", "w2", "w3", "output")) == \
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj", "up_proj")


def test_zero2_and_zero3_partitions_reassemble():
    """Two ranks. ZeRO-2: the group's flat vector [a(5) b(3)] = 8 values, padded to a multiple of 2*2 = 8, split
    4 + 4. ZeRO-3: each parameter is cut into ceil(n/2) per rank: a -> [a0 a1 a2 | a3 a4 pad], b -> [b0 b1 | b2 pad],
    rank r stores its chunks back to back: rank0 = [a0 a1 a2 b0 b1], rank1 = [a3 a4 0 b2 0]."""
    a, b = torch.arange(5.0), torch.arange(10.0, 13.0)
    shapes = [{"a": torch.Size([5]), "b": torch.Size([3])}]
    flat = torch.cat([a, b])
    zero2 = _merge_zero2(shapes, [[flat[:4]], [flat[4:]]], world=2)
    assert torch.equal(zero2["a"], a) and torch.equal(zero2["b"], b)
    rank0, rank1 = torch.tensor([0.0, 1, 2, 10, 11]), torch.tensor([3.0, 4, 0, 12, 0])
    zero3 = _merge_zero3(shapes, [[rank0], [rank1]], world=2)
    assert torch.equal(zero3["a"], a) and torch.equal(zero3["b"], b)
    with pytest.raises(ValueError, match="do not match"):
        _merge_zero3(shapes, [[rank0[:4]], [rank1[:4]]], world=2)


def _write_zero2(directory, world: int, parts: list[torch.Tensor]) -> None:
    directory.mkdir(parents=True)
    frozen = {"frozen_param_shapes": {"f": torch.Size([2])}, "frozen_param_fragments": {"f": torch.tensor([7.0, 8.0])}}
    torch.save({"module": {"buf": torch.ones(2)}, "buffer_names": ["buf"], "param_shapes": [{"w": torch.Size([2, 3])}],
                **frozen, "shared_params": {"w_alias": "w"}}, directory / "mp_rank_00_model_states.pt")
    for rank, part in enumerate(parts):
        optim = {"zero_stage": 2, "partition_count": [world], "single_partition_of_fp32_groups": [part]}
        torch.save({"optimizer_state_dict": optim}, directory / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")


def test_zero_directory_reader_and_its_errors(tmp_path):
    weight = torch.arange(6.0)  # 6 values, world 2: padded to 8, ranks hold 4 + 4
    _write_zero2(tmp_path / "ok", 2, [weight[:4], torch.cat([weight[4:], torch.zeros(2)])])
    state = read_zero_checkpoint(tmp_path / "ok")
    assert torch.equal(state["w"], weight.view(2, 3)) and torch.equal(state["f"], torch.tensor([7.0, 8.0]))
    assert torch.equal(state["buf"], torch.ones(2)) and state["w_alias"] is state["w"]
    _write_zero2(tmp_path / "missing_rank", 2, [weight[:4]])
    with pytest.raises(ValueError, match="partition_count says 2 ranks but there are 1"):
        read_zero_checkpoint(tmp_path / "missing_rank")
    with pytest.raises(FileNotFoundError, match="folder \\*above\\* a checkpoint tag"):
        read_zero_checkpoint(tmp_path)


def test_deepspeed_classes_unpickle_without_deepspeed(tmp_path, monkeypatch):
    """Optimizer files pickle DeepSpeed objects (LossScaler, ZeroStageEnum); without DeepSpeed they load as
    stand-ins, and int() of an enum stand-in gives its value."""
    fake = types.ModuleType("deepspeed_fake_for_test")

    class Stage(int):
        def __reduce__(self):
            return (Stage, (int(self),))

    Stage.__module__ = "deepspeed.runtime.zero.fake_config"
    Stage.__qualname__ = Stage.__name__ = "ZeroStageEnum"
    fake.ZeroStageEnum = Stage
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.zero.fake_config", fake)
    torch.save({"zero_stage": Stage(2)}, tmp_path / "x.pt", pickle_module=pickle)
    monkeypatch.delitem(sys.modules, "deepspeed.runtime.zero.fake_config")
    loaded = _load(tmp_path / "x.pt")
    assert type(loaded["zero_stage"]).__name__ == "_Missing" and int(loaded["zero_stage"]) == 2


def test_new_vocabulary_rows_start_at_the_mean_row():
    base = torch.tensor([[1.0, 2.0], [3.0, 6.0]])  # mean row [2, 4]
    report = LoadReport(lora_mode="none")
    grown = _fit_rows("language_model.model.embed_tokens.weight", base, 4, report)
    assert torch.equal(grown, torch.tensor([[1.0, 2.0], [3.0, 6.0], [2.0, 4.0], [2.0, 4.0]]))
    assert report.initialized_rows == ["language_model.model.embed_tokens.weight"]
    assert torch.equal(_fit_rows("language_model.lm_head.weight", base, 1, report), base[:1])  # shrink: copy
    assert _fit_rows("mlp1.0.weight", base, 4, report) is base


def test_compact_layout_needs_an_unmerged_adapter_and_auto_dtype_is_upstreams():
    torch.manual_seed(0)
    model = Sa2VAModel(build_preset("tiny", vocab_size=96))
    with pytest.raises(ValueError, match="layout='compact' needs an unmerged LoRA adapter"):
        xtuner_state_dict(model, layout="compact")
    full = xtuner_state_dict(model, layout="full")
    assert LLM + "model.layers.0.mlp.down_proj.base_layer.weight" in full and not any("lora_" in k for k in full)
    # upstream's convert_to_hf.py: ViT in the base dtype; the LLM in fp32 when the SFT config has llm_lora (peft's
    # k-bit preparation upcasts it before the merge), else in the base dtype; mlp1, SAM2 and fcs in fp32
    apply_hf_dtype(model, "auto", "bfloat16")
    assert model.vision_model.embeddings.patch_embedding.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.language_model.parameters())
    assert model.mlp1[1].weight.dtype == torch.float32 and model.text_hidden_fcs[0].weight.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.grounding_encoder.parameters())
    apply_hf_dtype(model, "auto", "bfloat16", has_llm_lora=False)
    assert model.language_model.lm_head.weight.dtype == torch.bfloat16 and model.mlp1[1].weight.dtype == torch.float32


def test_auto_layout_falls_back_to_full_for_internlm2_with_the_adapter_kept():
    """`convert to-xtuner --layout auto` of an RL run that kept the SFT adapter: compact for Qwen2; for InternLM2
    (Sa2VA-8B) the full layout, where it used to pick compact, which raises."""
    from test_checkpoint import internlm2_config

    from projects.llava_sam2.rl_train.model.network.lora import apply_lora

    torch.manual_seed(0)
    qwen2 = Sa2VAModel(build_preset("tiny", vocab_size=96))
    qwen2.language_model = apply_lora(qwen2.language_model, r=2, lora_alpha=4)
    assert resolve_layout("auto", qwen2) == ("compact", None)
    layout, why = resolve_layout("auto", qwen2, is_adapter_from_sft=False)  # RL's own adapter on merged SFT weights
    assert layout == "full" and "lora_mode='merge'" in why
    internlm2 = Sa2VAModel(internlm2_config())
    internlm2.language_model = apply_lora(internlm2.language_model, r=2, lora_alpha=4)
    with pytest.raises(ValueError, match="layout='compact' needs"):  # what the old auto choice ran into
        xtuner_state_dict(internlm2, layout="compact")
    layout, why = resolve_layout("auto", internlm2)
    assert layout == "full" and "InternLM2ForCausalLM" in why
    full = xtuner_state_dict(internlm2, layout=layout)
    assert not any("lora_" in key for key in full)
    assert resolve_layout("compact", internlm2) == ("compact", None)  # an explicit layout is kept (and raises later)


def test_frozen_sam2_decoder_is_honoured_and_sources_are_exclusive():
    from projects.llava_sam2.rl_train.engine.builders import check_model_source
    from projects.llava_sam2.rl_train.model.network.lora import apply_lora, configure_trainable

    torch.manual_seed(0)
    model = Sa2VAModel(build_preset("tiny", vocab_size=96))
    model.language_model = apply_lora(model.language_model, r=2, lora_alpha=4)
    trainable = configure_trainable(model, train_mask_decoder=False)  # upstream frozen_sam2_decoder=True
    assert not any("sam_mask_decoder" in name for name in trainable)
    assert any("lora_" in name for name in trainable) and any(name.startswith("text_hidden_fcs") for name in trainable)
    with pytest.raises(ValueError, match="exactly one of pretrained_path .* and upstream_sft"):
        check_model_source(None, "tiny", {"sft_model": {}})
