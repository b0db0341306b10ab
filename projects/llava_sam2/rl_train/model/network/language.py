"""The Sa2VA LLM, built from ``llm_config`` with transformers classes (docs/sa2va_internals.md §1.6).

Qwen2, Qwen3, Phi3 and Llama checkpoints load into the transformers class of the same name with identical
keys. InternLM2 (Sa2VA-8B/26B) ships as remote code; its blocks are exactly Llama blocks (RMSNorm,
RoPE, GQA attention without bias, SwiGLU), so we build ``LlamaForCausalLM`` and rename keys at load
and save time. Differs from upstream Sa2VA: no trust_remote_code, and the fused InternLM2 ``wqkv`` is
split into q/k/v per KV group (and re-fused on save, bit-exactly).
"""
from __future__ import annotations

import re

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM, PretrainedConfig,
                          PreTrainedModel, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from .configuration import SUPPORTED_LLM_ARCHITECTURES, SubConfig
from .transformers_seams import set_attention_implementation

_NATIVE = {
    "Qwen2ForCausalLM": (Qwen2Config, Qwen2ForCausalLM),
    "Qwen3ForCausalLM": (Qwen3Config, Qwen3ForCausalLM),  # Qwen2 blocks plus RMSNorm on each head's q and k
    "Phi3ForCausalLM": (Phi3Config, Phi3ForCausalLM),
    "LlamaForCausalLM": (LlamaConfig, LlamaForCausalLM),
}

# InternLM2 config keys carried over to LlamaConfig (same meaning, other name on the right).
_INTERNLM2_TO_LLAMA_CONFIG = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_hidden_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "hidden_act": "hidden_act",
    "max_position_embeddings": "max_position_embeddings",
    "initializer_range": "initializer_range",
    "rms_norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "rope_scaling": "rope_scaling",
    "bias": "attention_bias",
    "pad_token_id": "pad_token_id",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
}

# One-to-one InternLM2 ↔ Llama key fragments (checkpoint, module, anchored at the key start), relative
# to ``language_model.``; the fused wqkv is handled apart.
_INTERNLM2_RENAMES = [
    ("model.tok_embeddings.", "model.embed_tokens.", True),
    ("output.", "lm_head.", True),
    (".attention.wo.", ".self_attn.o_proj.", False),
    (".feed_forward.w1.", ".mlp.gate_proj.", False),
    (".feed_forward.w3.", ".mlp.up_proj.", False),
    (".feed_forward.w2.", ".mlp.down_proj.", False),
    (".attention_norm.", ".input_layernorm.", False),
    (".ffn_norm.", ".post_attention_layernorm.", False),
]
_WQKV = re.compile(r"^(model\.layers\.\d+)\.attention\.wqkv\.(weight|bias)$")
_QKV = re.compile(r"^(model\.layers\.\d+)\.self_attn\.([qkv])_proj\.(weight|bias)$")


def hf_llm_config(llm_config: SubConfig, attn_implementation: str = "sdpa") -> PretrainedConfig:
    """transformers config for the LLM. ``tie_word_embeddings`` is forced off: a separate
    ``lm_head`` is built and tied only when a checkpoint lacks it (§8.10)."""
    arch = llm_config.architectures[0]
    raw = llm_config.to_dict()
    if arch in _NATIVE:
        cfg_cls = _NATIVE[arch][0]
        raw.pop("attn_implementation", None)
        cfg = cfg_cls(**raw)
    elif arch == "InternLM2ForCausalLM":
        kwargs = {dst: raw[src] for src, dst in _INTERNLM2_TO_LLAMA_CONFIG.items() if src in raw}
        kwargs.setdefault("rms_norm_eps", 1e-6)
        cfg = LlamaConfig(**kwargs, mlp_bias=False, architectures=["LlamaForCausalLM"])
    else:
        raise ValueError(
            f"llm_config.architectures[0]={arch!r} is not supported; supported: {list(SUPPORTED_LLM_ARCHITECTURES)}"
        )
    cfg.tie_word_embeddings = False
    set_attention_implementation(cfg, attn_implementation)
    return cfg


def build_language_model(llm_config: SubConfig, attn_implementation: str = "sdpa") -> PreTrainedModel:
    arch = llm_config.architectures[0]
    model_cls = _NATIVE[arch][1] if arch in _NATIVE else LlamaForCausalLM
    return model_cls(hf_llm_config(llm_config, attn_implementation))


class LanguageKeyMap:
    """Maps language-model state-dict keys (relative to ``language_model.``) between the transformers
    module names and the checkpoint names. Identity except for InternLM2."""

    def __init__(self, llm_config: SubConfig):
        self.is_internlm2 = llm_config.architectures[0] == "InternLM2ForCausalLM"
        if self.is_internlm2:
            n_heads = int(llm_config.num_attention_heads)
            self.n_kv = int(llm_config.get("num_key_value_heads") or n_heads)
            self.group = n_heads // self.n_kv  # query heads per KV head
            self.head_dim = int(llm_config.hidden_size) // n_heads

    # -- checkpoint → module
    def to_module(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self.is_internlm2:
            return dict(state)
        out: dict[str, torch.Tensor] = {}
        for key, tensor in state.items():
            match = _WQKV.match(key)
            if match:
                q, k, v = self.split_wqkv(tensor)
                prefix, kind = match.groups()
                for name, part in zip("qkv", (q, k, v)):
                    out[f"{prefix}.self_attn.{name}_proj.{kind}"] = part
            else:
                out[_rename(key, to_module=True)] = tensor
        return out

    # -- module → checkpoint
    def to_checkpoint(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self.is_internlm2:
            return dict(state)
        out: dict[str, torch.Tensor] = {}
        for key, tensor in state.items():
            match = _QKV.match(key)
            if match is None:
                out[_rename(key, to_module=False)] = tensor
                continue
            prefix, which, kind = match.groups()
            if which != "q":
                continue  # fused together with q below
            parts = [state[f"{prefix}.self_attn.{n}_proj.{kind}"] for n in "qkv"]
            out[f"{prefix}.attention.wqkv.{kind}"] = self.fuse_wqkv(*parts)
        return out

    def split_wqkv(self, wqkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """wqkv rows are grouped per KV head: [g query heads | 1 key head | 1 value head] × n_kv.

        wqkv [n_kv·(g+2)·hd, ...] → q [n_kv·g·hd, ...], k [n_kv·hd, ...], v [n_kv·hd, ...]; query head
        j of group i becomes head i·g + j, the usual GQA order (head h reads KV head h // g).
        """
        rest = wqkv.shape[1:]
        grouped = wqkv.reshape(self.n_kv, self.group + 2, self.head_dim, *rest)  # [n_kv, g+2, hd, ...]
        q = grouped[:, : self.group].reshape(self.n_kv * self.group * self.head_dim, *rest)
        k = grouped[:, self.group].reshape(self.n_kv * self.head_dim, *rest)
        v = grouped[:, self.group + 1].reshape(self.n_kv * self.head_dim, *rest)
        return q.contiguous(), k.contiguous(), v.contiguous()

    def fuse_wqkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`split_wqkv`."""
        rest = q.shape[1:]
        q = q.reshape(self.n_kv, self.group, self.head_dim, *rest)  # [n_kv, g, hd, ...]
        k = k.reshape(self.n_kv, 1, self.head_dim, *rest)
        v = v.reshape(self.n_kv, 1, self.head_dim, *rest)
        fused = torch.cat([q, k, v], dim=1)  # [n_kv, g+2, hd, ...]
        return fused.reshape(-1, *rest).contiguous()

    def lm_head_key(self) -> str:
        """Checkpoint name of the LM head (relative to ``language_model.``)."""
        return "output.weight" if self.is_internlm2 else "lm_head.weight"


def _rename(key: str, to_module: bool) -> str:
    for ckpt, module, anchored in _INTERNLM2_RENAMES:
        src, dst = (ckpt, module) if to_module else (module, ckpt)
        if anchored and key.startswith(src):
            return dst + key[len(src):]
        if not anchored and src in key:
            return key.replace(src, dst, 1)
    return key
