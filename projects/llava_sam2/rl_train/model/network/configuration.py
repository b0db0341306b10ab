"""Sa2VA configuration: reads and writes the upstream ``config.json`` of ``Sa2VAChatConfig``.

The released checkpoints carry a flat JSON object with a nested ``vision_config`` (InternViT) and
``llm_config`` (a transformers causal-LM config). We keep both nested configs as dict-backed views so
that every key we do not interpret (``auto_map``, ``torch_dtype``, InternLM2's ``attn_implementation``
...) survives a load/save round trip unchanged.

Differs from upstream Sa2VA: an optional top-level ``grounding_config`` sizes the SAM2 module. It is
absent from released checkpoints, which always use SAM 2.0 Hiera-L at 1024 px (the default below).
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any

SUPPORTED_LLM_ARCHITECTURES = (
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",  # upstream codebase v2's InternVL-family code builds it too (transformers >= 4.56)
    "InternLM2ForCausalLM",
    "Phi3ForCausalLM",
    "LlamaForCausalLM",
)
SUPPORTED_PS_VERSIONS = ("v1", "v2")
SUPPORTED_VIT_NORMS = ("layer_norm", "rms_norm")

# Defaults of upstream InternVisionConfig, used when a key is absent from ``vision_config``.
VISION_DEFAULTS: dict[str, Any] = {
    "num_channels": 3,
    "patch_size": 14,
    "image_size": 224,
    "qkv_bias": False,
    "hidden_size": 3200,
    "num_attention_heads": 25,
    "intermediate_size": 12800,
    "qk_normalization": True,
    "num_hidden_layers": 48,
    "hidden_act": "gelu",
    "norm_type": "rms_norm",
    "layer_norm_eps": 1e-6,
    "initializer_factor": 0.1,
}

# SAM 2.0 Hiera-L as built by Sa2VA (sam2_hiera_l.yaml); docs/sa2va_internals.md §1.7.
SAM2_HIERA_L: dict[str, Any] = {
    "image_size": 1024,
    "backbone_stride": 16,
    "hidden_dim": 256,
    "mem_dim": 64,
    "num_maskmem": 7,
    "trunk": {
        "embed_dim": 144,
        "num_heads": 2,
        "stages": [2, 6, 36, 4],
        "global_att_blocks": [23, 33, 43],
        "window_pos_embed_bkg_spatial_size": [7, 7],
        "window_spec": [8, 4, 16, 8],
    },
    "memory_attention": {"num_layers": 4, "dim_feedforward": 2048},
    "memory_encoder": {"fuser_layers": 2},
}

# Keys of config.json that Sa2VAConfig interprets; everything else is kept verbatim in ``extra``.
_TOP_LEVEL_FIELDS: dict[str, Any] = {
    "use_backbone_lora": 0,
    "use_llm_lora": 0,
    "pad2square": False,
    "select_layer": -1,
    "force_image_size": None,
    "downsample_ratio": 0.5,
    "template": None,
    "dynamic_image_size": False,
    "use_thumbnail": False,
    "ps_version": "v1",
    "min_dynamic_patch": 1,
    "max_dynamic_patch": 6,
}
_DERIVED_FIELDS = ("hidden_size", "tie_word_embeddings", "model_type")


class SubConfig:
    """Attribute view over a nested config dict (``vision_config`` / ``llm_config``).

    Reads fall back to ``defaults``; writes go into the dict, so ``to_dict()`` returns the original
    keys plus whatever was set, in the original order.
    """

    def __init__(self, data: dict[str, Any], defaults: dict[str, Any] | None = None, name: str = ""):
        object.__setattr__(self, "_data", copy.deepcopy(dict(data)))
        object.__setattr__(self, "_defaults", dict(defaults or {}))
        object.__setattr__(self, "_name", name)

    def __getattr__(self, key: str) -> Any:
        # copy/deepcopy/pickle probe attributes before __init__ ran: no _data yet, so don't recurse
        if key.startswith("__") or key in ("_data", "_defaults", "_name"):
            raise AttributeError(key)
        data, defaults = self._data, self._defaults
        if key in data:
            return data[key]
        if key in defaults:
            return defaults[key]
        raise AttributeError(f"{self._name} has no key {key!r} (keys: {sorted(data)})")

    def __setattr__(self, key: str, value: Any) -> None:
        self._data[key] = value

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, self._defaults.get(key, default))

    def __contains__(self, key: str) -> bool:
        return key in self._data

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubConfig) and self._data == other._data

    def __repr__(self) -> str:
        return f"SubConfig({self._name}, {self._data})"


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge (override wins); used to fill grounding_config from the Hiera-L default."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class GroundingSizes:
    """The SAM2 sizes of a Sa2VA config (both families), from its ``grounding_config`` over the Hiera-L defaults."""

    grounding_config: dict[str, Any] | None

    @property
    def grounding(self) -> dict[str, Any]:
        """Resolved SAM2 sizes: Hiera-L defaults overridden by ``grounding_config``."""
        return _merge(SAM2_HIERA_L, self.grounding_config or {})

    @property
    def sam_image_size(self) -> int:
        """Side S_sam of the square SAM2 input (1024 for released models)."""
        return int(self.grounding["image_size"])

    @property
    def sam_hidden_dim(self) -> int:
        """SAM2 prompt/decoder width (256 for released models) = text_hidden_fcs output."""
        return int(self.grounding["hidden_dim"])

    @property
    def sam_low_res_size(self) -> int:
        """Side h of the low-res mask logits = S_sam / backbone_stride * 4 (256 for 1024 px)."""
        return self.sam_image_size // int(self.grounding["backbone_stride"]) * 4


class Sa2VAConfig(GroundingSizes):
    """In-memory form of Sa2VA's ``config.json``.

    Attributes mirror the JSON keys (``template``, ``force_image_size``, ``downsample_ratio``,
    ``min_dynamic_patch``, ``max_dynamic_patch``, ``use_thumbnail``, ``ps_version``, ``select_layer``,
    ``vision_config``, ``llm_config``, optional ``grounding_config``); unknown keys live in ``extra``.
    """

    def __init__(
        self,
        vision_config: dict[str, Any],
        llm_config: dict[str, Any],
        grounding_config: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        **fields: Any,
    ):
        unknown = set(fields) - set(_TOP_LEVEL_FIELDS)
        if unknown:
            raise TypeError(f"Sa2VAConfig got unknown fields {sorted(unknown)}; pass them in extra=")
        for key, default in _TOP_LEVEL_FIELDS.items():
            setattr(self, key, copy.deepcopy(fields.get(key, default)))
        if isinstance(self.template, str):
            self.template = self.template.replace("-", "_")
        self.vision_config = SubConfig(vision_config, VISION_DEFAULTS, "vision_config")
        self.llm_config = SubConfig(llm_config, {}, "llm_config")
        self.grounding_config = copy.deepcopy(grounding_config)
        self.extra = copy.deepcopy(extra or {})
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        archs = self.llm_config.get("architectures")
        if not archs:
            raise ValueError(
                "config.json llm_config.architectures is missing or empty; expected one of "
                f"{list(SUPPORTED_LLM_ARCHITECTURES)}"
            )
        if archs[0] not in SUPPORTED_LLM_ARCHITECTURES:
            raise ValueError(
                f"config.json llm_config.architectures[0]={archs[0]!r} is not supported; supported: "
                f"{list(SUPPORTED_LLM_ARCHITECTURES)}. Convert the checkpoint to one of these LLMs."
            )
        if self.ps_version not in SUPPORTED_PS_VERSIONS:
            raise ValueError(f"config.json ps_version={self.ps_version!r}; expected one of {SUPPORTED_PS_VERSIONS}")
        if self.vision_config.norm_type not in SUPPORTED_VIT_NORMS:
            raise ValueError(
                f"config.json vision_config.norm_type={self.vision_config.norm_type!r}; "
                f"expected one of {SUPPORTED_VIT_NORMS}"
            )
        inverse = 1.0 / self.downsample_ratio
        if abs(inverse - round(inverse)) > 1e-6 or self.patch_grid % round(inverse):
            raise ValueError(
                f"config.json downsample_ratio={self.downsample_ratio} must be 1/k with k dividing the "
                f"{self.patch_grid}x{self.patch_grid} patch grid (released models use 0.5)"
            )

    # ------------------------------------------------------------------ derived properties
    @property
    def image_size(self) -> int:
        """Tile side S fed to the ViT (``force_image_size`` or ``vision_config.image_size``)."""
        return int(self.force_image_size or self.vision_config.image_size)

    @property
    def patch_size(self) -> int:
        return int(self.vision_config.patch_size)

    @property
    def patch_grid(self) -> int:
        """Patches per side of one tile (32 for 448/14)."""
        return self.image_size // self.patch_size

    @property
    def region_grid_size(self) -> int:
        """Token grid side g after pixel shuffle (16 for released models)."""
        return int(round(self.patch_grid * self.downsample_ratio))

    @property
    def num_image_token(self) -> int:
        """Tokens per tile t = g² (256 for released models)."""
        return self.region_grid_size**2

    @property
    def llm_architecture(self) -> str:
        return self.llm_config.architectures[0]

    @property
    def llm_hidden_size(self) -> int:
        return int(self.llm_config.hidden_size)

    @property
    def hidden_size(self) -> int:
        return self.llm_hidden_size

    @property
    def vocab_size(self) -> int:
        return int(self.llm_config.vocab_size)

    @property
    def vit_hidden_size(self) -> int:
        return int(self.vision_config.hidden_size)

    # ------------------------------------------------------------------ (de)serialisation
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Sa2VAConfig":
        if not isinstance(data, dict):
            raise TypeError(f"Sa2VAConfig.from_dict expects a dict, got {type(data).__name__}")
        for key in ("vision_config", "llm_config"):
            if not isinstance(data.get(key), dict):
                raise ValueError(f"config.json has no {key!r} object; is this a Sa2VA checkpoint?")
        fields = {k: data[k] for k in _TOP_LEVEL_FIELDS if k in data}
        known = set(_TOP_LEVEL_FIELDS) | {"vision_config", "llm_config", "grounding_config"}
        extra = {k: v for k, v in data.items() if k not in known and k not in _DERIVED_FIELDS}
        return cls(data["vision_config"], data["llm_config"], data.get("grounding_config"), extra, **fields)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "Sa2VAConfig":
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err}); re-export the checkpoint's config.json") from err
        try:
            return cls.from_dict(data)
        except (ValueError, TypeError) as err:
            raise type(err)(f"{path}: {err}") from err

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "vision_config": self.vision_config.to_dict(),
            "llm_config": self.llm_config.to_dict(),
        }
        for key in _TOP_LEVEL_FIELDS:
            out[key] = copy.deepcopy(getattr(self, key))
        out["hidden_size"] = self.llm_hidden_size
        out["tie_word_embeddings"] = False  # upstream forces this at top level
        out["model_type"] = "sa2va_chat"
        if self.grounding_config is not None:
            out["grounding_config"] = copy.deepcopy(self.grounding_config)
        out.update(copy.deepcopy(self.extra))
        return out

    def to_json_file(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True)
            f.write("\n")

    def copy(self) -> "Sa2VAConfig":
        return Sa2VAConfig.from_dict(self.to_dict())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sa2VAConfig) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return (
            f"Sa2VAConfig(llm={self.llm_architecture}, D={self.llm_hidden_size}, V={self.vocab_size}, "
            f"vit_C={self.vit_hidden_size}, tile={self.image_size}, sam={self.sam_image_size}, "
            f"template={self.template!r})"
        )
