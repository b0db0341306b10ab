"""Size presets as data: ``build_preset(name, vocab_size=None) -> Sa2VAConfig``.

Real presets follow docs/sa2va_internals.md §1.3-§1.8 (InternViT-300M-448px-V2_5 + Qwen2.5-0.5B / Qwen2.5-3B /
InternLM2.5-7B + SAM 2.0 Hiera-L) and §9 for the InternVL3 family (``in3_2b`` / ``in3_8b`` / ``in3_14b``: the same ViT
with Qwen2.5-1.5B / -7B / -14B). They are for shapes (layouts, memory plans, benchmarks with random
weights); a real checkpoint always brings its own config.json, which wins. Values not confirmed against
a released config.json (rope_theta, rms_norm_eps, max_position_embeddings) are InternVL2.5 defaults
[verify]. ``tiny`` is the CPU test model; ``tiny_qwen3`` is it with a Qwen3 LLM. No Sa2VA
checkpoint with a Qwen3 LLM in the InternVL family is released upstream (its model zoo at codebase v2), so there is no
released-size Qwen3 preset.

``QWEN_VL_PRESETS`` are the Qwen-VL family (``qwen_vl``): Sa2VA-Qwen2.5-VL-3B / -7B and Sa2VA-Qwen3-VL-4B, the
base models' config.json fields (Qwen2.5-VL-3B/7B-Instruct, Qwen3-VL-4B-Instruct) in the layout upstream's converter
writes, with the vocabulary grown by Sa2VA's five special tokens; the Qwen2.5-VL sizes are checked against copies of
the released config.json files (docs/upstream.md, the Qwen-VL section). ``tiny_qwen25vl`` / ``tiny_qwen3vl`` are
CPU-sized members of the family whose vocabulary and vision-marker ids are the tiny Qwen-VL tokenizer's
(``qwen_processor.tiny_qwen_vl_tokenizer``). ``build_preset`` returns a ``Sa2VAQwenConfig`` for them; building one
needs the transformers release that has the family (``QWEN_VL_FAMILIES``).
"""
from __future__ import annotations

import copy
from typing import Any

from .configuration import Sa2VAConfig
from .qwen_vl import QWEN_VL_ARCHITECTURES, QWEN_VL_AUTO_MAP, Sa2VAQwenConfig

_HF_EXTRA = {
    "architectures": ["Sa2VAChatModel"],
    "auto_map": {
        "AutoConfig": "configuration_sa2va_chat.Sa2VAChatConfig",
        "AutoModel": "modeling_sa2va_chat.Sa2VAChatModel",
        "AutoModelForCausalLM": "modeling_sa2va_chat.Sa2VAChatModel",
    },
    "torch_dtype": "bfloat16",
}

_INTERNVIT_300M = {
    "architectures": ["InternVisionModel"],
    "model_type": "intern_vit_6b",
    "image_size": 448,
    "patch_size": 14,
    "num_channels": 3,
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "qkv_bias": True,
    "qk_normalization": False,
    "norm_type": "layer_norm",
    "layer_norm_eps": 1e-6,
    "hidden_act": "gelu",
    "initializer_factor": 1.0,
    "use_flash_attn": True,
}

_TOP_LEVEL_448 = {
    "force_image_size": 448,
    "downsample_ratio": 0.5,
    "dynamic_image_size": True,
    "use_thumbnail": True,
    "ps_version": "v2",
    "min_dynamic_patch": 1,
    "max_dynamic_patch": 12,
    "select_layer": -1,
}


def _qwen2(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": ffn,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "vocab_size": 151679,
    }


def _internvl3_qwen2(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int) -> dict[str, Any]:
    """InternVL3's Qwen2.5 llm_config: dynamic NTK RoPE scaling (factor 2) on top of the plain Qwen2 fields."""
    return {**_qwen2(hidden, layers, heads, kv_heads, ffn),
            "rope_scaling": {"factor": 2.0, "rope_type": "dynamic", "type": "dynamic"}}


def _qwen3(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, head_dim: int) -> dict[str, Any]:
    """A Qwen3 llm_config (the Qwen3 config.json fields): Qwen2's plus a head size of its own and no attention bias."""
    return {**_qwen2(hidden, layers, heads, kv_heads, ffn), "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3", "head_dim": head_dim, "attention_bias": False}


_INTERNLM2_7B = {
    "architectures": ["InternLM2ForCausalLM"],
    "model_type": "internlm2",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "dynamic", "factor": 2.0},
    "bias": False,
    "tie_word_embeddings": False,
    "attn_implementation": "eager",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "vocab_size": 92558,
}

_TINY_VISION = {
    "architectures": ["InternVisionModel"],
    "model_type": "intern_vit_6b",
    "image_size": 224,
    "patch_size": 14,
    "num_channels": 3,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "qkv_bias": True,
    "qk_normalization": False,
    "norm_type": "layer_norm",
    "layer_norm_eps": 1e-6,
    "hidden_act": "gelu",
    "initializer_factor": 1.0,
}

_TINY_LLM = {
    **_qwen2(hidden=128, layers=2, heads=4, kv_heads=2, ffn=256),
    "max_position_embeddings": 4096,
}

# Qwen3 at tiny size; head_dim 48 != hidden / heads (32), as in Qwen3 checkpoints, so a code path that derives the head
# size from the hidden size fails here
_TINY_QWEN3_LLM = {
    **_qwen3(hidden=128, layers=2, heads=4, kv_heads=2, ffn=256, head_dim=48),
    "max_position_embeddings": 4096,
}

_TINY_GROUNDING = {
    "image_size": 256,
    "backbone_stride": 16,
    "hidden_dim": 32,
    "mem_dim": 16,
    "num_maskmem": 7,
    "trunk": {
        "embed_dim": 16,
        "num_heads": 1,
        "stages": [1, 2, 2, 1],
        "global_att_blocks": [4],
        "window_pos_embed_bkg_spatial_size": [4, 4],
        "window_spec": [8, 4, 8, 8],
    },
    "memory_attention": {"num_layers": 1, "dim_feedforward": 64},
    "memory_encoder": {"fuser_layers": 2},
}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"vision_config": _TINY_VISION, "llm_config": _TINY_LLM, "grounding_config": _TINY_GROUNDING,
             "template": "qwen_chat", **_TOP_LEVEL_448, "force_image_size": 224, "max_dynamic_patch": 1},
    # the tiny model with a Qwen3 LLM (upstream codebase v2's InternVL-family code builds Qwen3ForCausalLM)
    "tiny_qwen3": {"vision_config": _TINY_VISION, "llm_config": _TINY_QWEN3_LLM, "grounding_config": _TINY_GROUNDING,
                   "template": "qwen_chat", **_TOP_LEVEL_448, "force_image_size": 224, "max_dynamic_patch": 1},
    "1b": {"vision_config": _INTERNVIT_300M, "llm_config": _qwen2(896, 24, 14, 2, 4864),
           "template": "qwen_chat", **_TOP_LEVEL_448},
    # sa2va_4b.py trains Qwen2.5-3B with phi3_chat tags (reference §8.1); a 4B checkpoint may say qwen_chat.
    "4b": {"vision_config": _INTERNVIT_300M, "llm_config": _qwen2(2048, 36, 16, 2, 11008),
           "template": "phi3_chat", **_TOP_LEVEL_448},
    "8b": {"vision_config": _INTERNVIT_300M, "llm_config": _INTERNLM2_7B,
           "template": "internlm2_chat", **_TOP_LEVEL_448},
    # Sa2VA-InternVL3 (codebase v2, docs/sa2va_internals.md §9): every size trains with qwen_chat.
    "in3_2b": {"vision_config": _INTERNVIT_300M, "llm_config": _internvl3_qwen2(1536, 28, 12, 2, 8960),
               "template": "qwen_chat", **_TOP_LEVEL_448},
    "in3_8b": {"vision_config": _INTERNVIT_300M, "llm_config": _internvl3_qwen2(3584, 28, 28, 4, 18944),
               "template": "qwen_chat", **_TOP_LEVEL_448},
    "in3_14b": {"vision_config": _INTERNVIT_300M, "llm_config": _internvl3_qwen2(5120, 48, 40, 8, 13824),
                "template": "qwen_chat", **_TOP_LEVEL_448},
}


# Qwen2.5-VL's vision tower (both sizes): 32 blocks, window attention except the 4 full-attention blocks.
def _qwen25_vl_vision(out_hidden: int) -> dict[str, Any]:
    return {"model_type": "qwen2_5_vl", "depth": 32, "hidden_size": 1280, "hidden_act": "silu",
            "intermediate_size": 3420, "num_heads": 16, "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "tokens_per_second": 2, "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31], "out_hidden_size": out_hidden}


def _qwen25_vl_text(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, max_window_layers: int
                    ) -> dict[str, Any]:
    return {"model_type": "qwen2_5_vl_text", "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": ffn,
            "hidden_act": "silu", "max_position_embeddings": 128000, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "rope_scaling": {"type": "mrope", "rope_type": "default", "mrope_section": [16, 24, 24]},
            "use_sliding_window": False, "sliding_window": 32768, "max_window_layers": max_window_layers,
            "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
            "vocab_size": 151665 + 5}


def _qwen_vl_top(text: dict[str, Any], vision: dict[str, Any]) -> dict[str, Any]:
    return {"text_config": text, "vision_config": vision, "image_token_id": 151655, "video_token_id": 151656,
            "vision_start_token_id": 151652, "vision_end_token_id": 151653, "tie_word_embeddings": False,
            "template": "qwen_chat", "architectures": list(QWEN_VL_ARCHITECTURES), "auto_map": dict(QWEN_VL_AUTO_MAP),
            "torch_dtype": "bfloat16"}


QWEN_VL_PRESETS: dict[str, dict[str, Any]] = {
    # max_window_layers as released (70 in the 3B, 28 in the 7B); unused while use_sliding_window is off
    "qwen25vl_3b": _qwen_vl_top(_qwen25_vl_text(2048, 36, 16, 2, 11008, 70), _qwen25_vl_vision(2048)),
    "qwen25vl_7b": _qwen_vl_top(_qwen25_vl_text(3584, 28, 28, 4, 18944, 28), _qwen25_vl_vision(3584)),
    "qwen3vl_4b": _qwen_vl_top(
        {"model_type": "qwen3_vl_text", "hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 9728, "hidden_act": "silu",
         "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "rope_theta": 5000000.0,
         "rope_scaling": {"rope_type": "default", "mrope_interleaved": True, "mrope_section": [24, 20, 20]},
         "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
         "vocab_size": 151669 + 5},
        {"model_type": "qwen3_vl", "depth": 24, "hidden_size": 1024, "hidden_act": "gelu_pytorch_tanh",
         "intermediate_size": 4096, "num_heads": 16, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
         "temporal_patch_size": 2, "num_position_embeddings": 2304, "deepstack_visual_indexes": [5, 11, 17],
         "out_hidden_size": 2560}),
}



def _tiny_qwen_vl(family: str) -> dict[str, Any]:
    """A CPU-sized member of the family (2 text layers of width 64, a 2-block vision tower, the tiny SAM2); the
    vocabulary and the vision-marker ids are the tiny Qwen-VL tokenizer's, filled in by ``build_preset``."""
    text = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 128, "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False}
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_channels": 3,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 64}
    if family == "qwen2_5_vl":
        text.update(model_type="qwen2_5_vl_text", rope_theta=1000000.0,
                    rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": [2, 3, 3]})
        vision.update(model_type="qwen2_5_vl", hidden_act="silu", patch_size=14, window_size=56,
                      fullatt_block_indexes=[1], tokens_per_second=2)
    else:
        text.update(model_type="qwen3_vl_text", head_dim=16, rope_theta=5000000.0, attention_bias=False,
                    rope_scaling={"rope_type": "default", "mrope_interleaved": True, "mrope_section": [2, 3, 3]})
        vision.update(model_type="qwen3_vl", hidden_act="gelu_pytorch_tanh", patch_size=16,
                      num_position_embeddings=16, deepstack_visual_indexes=[0])
    return {**_qwen_vl_top(text, vision), "grounding_config": copy.deepcopy(_TINY_GROUNDING),
            "torch_dtype": "float32"}


QWEN_VL_PRESETS["tiny_qwen25vl"] = _tiny_qwen_vl("qwen2_5_vl")
QWEN_VL_PRESETS["tiny_qwen3vl"] = _tiny_qwen_vl("qwen3_vl")


def _tiny_vocab_size() -> int:
    try:
        from ..text.tokenizer import load_tiny_tokenizer
    except ImportError as err:
        raise ValueError(
            "build_preset('tiny') needs vocab_size= until model/text/tokenizer.py (load_tiny_tokenizer) exists"
        ) from err
    return len(load_tiny_tokenizer())


def build_preset(name: str, vocab_size: int | None = None) -> Sa2VAConfig | Sa2VAQwenConfig:
    """Config of a named size. ``vocab_size`` overrides ``llm_config.vocab_size`` (``text_config.vocab_size`` for the
    Qwen-VL presets; tiny: the tiny tokenizer's length by default)."""
    if name in QWEN_VL_PRESETS:
        data = copy.deepcopy(QWEN_VL_PRESETS[name])
        if name.startswith("tiny"):
            from ..text.qwen_processor import tiny_qwen_vl_tokenizer, vision_token_fields

            tokenizer = tiny_qwen_vl_tokenizer()
            data.update(vision_token_fields(tokenizer))
            data["text_config"].update(vocab_size=len(tokenizer), bos_token_id=tokenizer.convert_tokens_to_ids(
                "<|endoftext|>"), eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))
        if vocab_size is not None:
            data["text_config"]["vocab_size"] = int(vocab_size)
        return Sa2VAQwenConfig(data)
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS) + sorted(QWEN_VL_PRESETS)}")
    data = copy.deepcopy(PRESETS[name])
    is_tiny = name.startswith("tiny")
    if vocab_size is None and is_tiny:
        vocab_size = _tiny_vocab_size()
    if vocab_size is not None:
        if int(vocab_size) <= 0:
            raise ValueError(f"build_preset({name!r}): vocab_size must be positive, got {vocab_size}")
        data["llm_config"]["vocab_size"] = int(vocab_size)
    data.update(copy.deepcopy(_HF_EXTRA))
    if is_tiny:
        data["torch_dtype"] = "float32"
    return Sa2VAConfig.from_dict(data)
