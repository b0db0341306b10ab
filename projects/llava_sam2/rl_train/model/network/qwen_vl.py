"""The Qwen-VL Sa2VA family (Sa2VA-Qwen2.5-VL-3B/7B, Sa2VA-Qwen3-VL-4B): config and model.

Upstream (codebase v2, ``Sa2VAChatModelQwen``) wraps a transformers ``Qwen2_5_VLForConditionalGeneration`` or
``Qwen3VLForConditionalGeneration`` as ``model`` and adds the same grounding half as the InternVL family:
``text_hidden_fcs`` and ``grounding_encoder.sam2_model`` (SAM 2.0 Hiera-L). Its ``config.json`` is the Qwen-VL config
itself (``text_config``, ``vision_config``, the image/vision token ids) plus ``template``, ``architectures``
``["Sa2VAChatModelQwen"]`` and the remote-code ``auto_map``. Checkpoint keys are module names: ``model.model.visual.*``,
``model.model.language_model.*``, ``model.lm_head.weight``, ``grounding_encoder.sam2_model.*`` (CXBlock ``.gamma``
written ``.g_weight``, as the InternVL family), ``text_hidden_fcs.*``.

How the LLM sees an image differs from the InternVL family, and this class keeps transformers' own code for it: the
Qwen vision tower (patches of a processor-resized image, ``pixel_values [P, C·t·p²]`` + ``image_grid_thw [I, 3]``)
fills the ``<|image_pad|>`` positions, positions are 3-D M-RoPE ids (``get_rope_index``), and Qwen3-VL adds its
deepstack visual features to the first LLM layers' states at the image positions. :meth:`Sa2VAQwenModel.llm_forward`
is that forward; the ``[SEG]`` → mask half is the shared ``seg_head.SegGroundingMixin``.

Differs from upstream: an optional top-level ``grounding_config`` sizes SAM2 (absent from released checkpoints,
which use Hiera-L at 1024 px), as in the InternVL family's config.
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any

import torch
import transformers
from packaging.version import Version
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn

from ..text.constants import SEG_TOKEN
from .configuration import GroundingSizes
from .grounding import GroundingEncoder
from .seg_head import SegGroundingMixin, build_text_hidden_fcs
from .transformers_seams import set_attention_implementation

QWEN_VL_ARCHITECTURES = ["Sa2VAChatModelQwen"]
QWEN_IMAGE_TOKEN = "<|image_pad|>"
# vision_config.model_type -> (transformers config class, model class, first transformers release that has them)
QWEN_VL_FAMILIES: dict[str, tuple[str, str, str]] = {
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", "4.49"),
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration", "4.57"),
}
QWEN_VL_AUTO_MAP = {
    "AutoConfig": "configuration_sa2va_chat.Sa2VAChatConfigQwen",
    "AutoModel": "modeling_sa2va_qwen.Sa2VAChatModelQwen",
    "AutoModelForCausalLM": "modeling_sa2va_qwen.Sa2VAChatModelQwen",
}
# LoRA targets of upstream's SFT for this family: every nn.Linear of the text decoder (a regex over module names)
LANGUAGE_LORA_TARGETS = r".*language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"
# vision_config.model_type -> whether transformers' output_hidden_states[-1], where upstream reads the [SEG] state, is
# after the final norm: Qwen2.5-VL's text model appends the normed state, Qwen3-VL's (4.57) the last layer's output
SEG_STATE_AFTER_FINAL_NORM = {"qwen2_5_vl": True, "qwen3_vl": False}
# config.json keys that belong to the Sa2VA wrapper, not to the transformers Qwen-VL config
_WRAPPER_KEYS = ("template", "grounding_config", "auto_map", "architectures", "model_type")


def is_qwen_vl_config(data: dict[str, Any]) -> bool:
    """A Sa2VA-Qwen config.json: upstream's architecture name, or a Qwen-VL ``vision_config``."""
    archs = data.get("architectures") or []
    vision_type = (data.get("vision_config") or {}).get("model_type")
    return bool(set(archs) & set(QWEN_VL_ARCHITECTURES)) or vision_type in QWEN_VL_FAMILIES


class Sa2VAQwenConfig(GroundingSizes):
    """In-memory form of a Sa2VA-Qwen ``config.json``; every key is kept verbatim (``data``) for the round trip.

    Attributes: ``data`` (the JSON object without ``grounding_config``), ``grounding_config`` (None for released
    checkpoints), ``template``.
    """

    def __init__(self, data: dict[str, Any], grounding_config: dict[str, Any] | None = None):
        if not isinstance(data, dict) or not isinstance(data.get("vision_config"), dict):
            raise ValueError("a Sa2VA-Qwen config.json needs a 'vision_config' object (the Qwen-VL vision tower)")
        self.data = copy.deepcopy(data)
        self.data.pop("grounding_config", None)
        self.grounding_config = copy.deepcopy(grounding_config if grounding_config is not None
                                              else data.get("grounding_config"))
        if self.family not in QWEN_VL_FAMILIES:
            raise ValueError(f"config.json vision_config.model_type={self.family!r}; the Qwen-VL family supports "
                             f"{sorted(QWEN_VL_FAMILIES)}")

    # ------------------------------------------------------------------ fields
    @property
    def family(self) -> str:
        """``'qwen2_5_vl'`` or ``'qwen3_vl'`` (the vision config's model_type)."""
        return self.data["vision_config"].get("model_type")

    @property
    def template(self) -> str | None:
        return self.data.get("template")

    @property
    def text_config(self) -> dict[str, Any]:
        """The LLM's fields: ``text_config``, or the top level for a Qwen2.5-VL config written before it existed."""
        return self.data.get("text_config") or self.data

    @property
    def llm_hidden_size(self) -> int:
        return int(self.text_config["hidden_size"])

    @property
    def hidden_size(self) -> int:
        return self.llm_hidden_size

    @property
    def vocab_size(self) -> int:
        return int(self.text_config["vocab_size"])

    # ------------------------------------------------------------------ transformers side
    def transformers_classes(self) -> tuple[type, type]:
        """(config class, model class) of this family; a clear error on a transformers that lacks them."""
        config_name, model_name, needs = QWEN_VL_FAMILIES[self.family]
        if Version(transformers.__version__) < Version(needs) or not hasattr(transformers, model_name):
            raise ValueError(f"{self.family} checkpoints need transformers >= {needs} ({model_name}); this environment "
                             f"has transformers {transformers.__version__}")
        return getattr(transformers, config_name), getattr(transformers, model_name)

    def hf_config(self, attn_implementation: str = "sdpa"):
        """The transformers Qwen-VL config, LM head untied (Sa2VA saves its own ``lm_head``)."""
        config_cls, _ = self.transformers_classes()
        raw = {k: v for k, v in copy.deepcopy(self.data).items() if k not in _WRAPPER_KEYS}
        config = config_cls(**raw)
        config.tie_word_embeddings = False
        config.get_text_config().tie_word_embeddings = False
        for sub in (config, config.get_text_config(), config.vision_config):
            set_attention_implementation(sub, attn_implementation)
        return config

    # ------------------------------------------------------------------ (de)serialisation
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Sa2VAQwenConfig":
        return cls(data)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "Sa2VAQwenConfig":
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        try:
            return cls(data)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err

    def to_dict(self) -> dict[str, Any]:
        out = copy.deepcopy(self.data)
        out.setdefault("architectures", list(QWEN_VL_ARCHITECTURES))
        out.setdefault("auto_map", dict(QWEN_VL_AUTO_MAP))
        out["model_type"] = "sa2va_chat"
        if self.grounding_config is not None:
            out["grounding_config"] = copy.deepcopy(self.grounding_config)
        return out

    def to_json_file(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True)
            f.write("\n")

    def copy(self) -> "Sa2VAQwenConfig":
        return Sa2VAQwenConfig(self.to_dict())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sa2VAQwenConfig) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return (f"Sa2VAQwenConfig(family={self.family}, D={self.llm_hidden_size}, V={self.vocab_size}, "
                f"sam={self.sam_image_size}, template={self.template!r})")


class Sa2VAQwenModel(SegGroundingMixin, nn.Module):
    """``model`` (transformers Qwen-VL) + ``grounding_encoder`` (SAM2) + ``text_hidden_fcs``, named as upstream's
    checkpoint keys."""

    family = "qwen_vl"

    def __init__(self, config: Sa2VAQwenConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        if not isinstance(config, Sa2VAQwenConfig):
            raise TypeError(f"Sa2VAQwenModel expects a Sa2VAQwenConfig, got {type(config).__name__}")
        self.config = config
        _, model_cls = config.transformers_classes()
        self.model = model_cls(config.hf_config(attn_implementation))
        self.grounding_encoder = GroundingEncoder(config.grounding)
        self.text_hidden_fcs = build_text_hidden_fcs(config.llm_hidden_size, config.sam_hidden_dim)
        self.image_token_id: int | None = None
        self.seg_token_id: int | None = None
        self.lm_head_tied = False

    @property
    def device(self) -> torch.device:
        return self.text_hidden_fcs[0].weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.text_hidden_fcs[0].weight.dtype

    @property
    def hf_model(self) -> nn.Module:
        """The transformers Qwen-VL model, unwrapped when LoRA wraps it (:meth:`apply_lora`)."""
        return self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model

    @property
    def language_model(self) -> nn.Module:
        """The Qwen text decoder (embeddings, layers, final norm; no head), LoRA layers included once applied."""
        return self.hf_model.model.language_model

    @property
    def visual(self) -> nn.Module:
        """The Qwen vision tower (its merger included: the projector)."""
        return self.hf_model.model.visual

    @property
    def seg_state_after_final_norm(self) -> bool:
        """Whether the ``[SEG]`` state (``llm_forward(...).hidden_states[-1]``, as upstream) is after the final norm
        (Qwen2.5-VL) or the last decoder layer's output before it (Qwen3-VL)."""
        return SEG_STATE_AFTER_FINAL_NORM[self.config.family]

    def project_vision(self, vit_tokens: None) -> None:
        """The InternVL family's per-pass ``mlp1`` projection has no counterpart here: the merger sits inside the
        frozen vision tower, and each pass builds its image rows from ``EncodedImages.vision_inputs``
        (``pipeline.qwen_vl_prompts``). The shared passes take ``tile_embeds=None`` for this family."""
        if vit_tokens is not None:
            raise ValueError("project_vision: the Qwen-VL family encodes no InternViT tokens (vit_tokens must be None)")
        return None

    def get_input_embeddings(self) -> nn.Module:
        return self.hf_model.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        return self.hf_model.get_output_embeddings()

    def apply_lora(self, r: int = 128, lora_alpha: int = 256, lora_dropout: float = 0.05) -> None:
        """LoRA on every linear layer of the text decoder, as upstream's SFT of this family (the whole Qwen-VL model
        is peft-wrapped, the targets are ``language_model`` linears; the vision tower gets none). B starts at 0."""
        if isinstance(self.model, PeftModel):
            raise ValueError("apply_lora: the Qwen-VL model is already peft-wrapped; apply LoRA once")
        config = LoraConfig(r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, bias="none",
                            task_type="CAUSAL_LM", target_modules=LANGUAGE_LORA_TARGETS)
        self.model = get_peft_model(self.model, config)

    def bind_tokenizer(self, tokenizer) -> None:
        """Read the ``<|image_pad|>`` / ``[SEG]`` ids, check them against the config and the embedding table."""
        rows = self.get_input_embeddings().weight.shape[0]
        if len(tokenizer) > rows:
            raise ValueError(f"tokenizer has {len(tokenizer)} tokens but the LLM embedding has {rows} rows "
                             "(text_config.vocab_size); use the tokenizer saved with this checkpoint")
        ids = {}
        for token in (QWEN_IMAGE_TOKEN, SEG_TOKEN):
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token_id is None or token_id == tokenizer.unk_token_id or token_id >= rows:
                raise ValueError(f"tokenizer does not know {token!r} (got id {token_id}); use the checkpoint's "
                                 "processor (a Qwen-VL tokenizer with Sa2VA's special tokens)")
            ids[token] = int(token_id)
        configured = self.config.data.get("image_token_id")
        if configured is not None and configured != ids[QWEN_IMAGE_TOKEN]:
            raise ValueError(f"config.json image_token_id={configured} but the tokenizer's {QWEN_IMAGE_TOKEN} is "
                             f"{ids[QWEN_IMAGE_TOKEN]}; the tokenizer does not belong to this checkpoint")
        self.image_token_id, self.seg_token_id = ids[QWEN_IMAGE_TOKEN], ids[SEG_TOKEN]

    def llm_forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    pixel_values: torch.Tensor | None = None, image_grid_thw: torch.Tensor | None = None,
                    **kwargs: Any):
        """transformers' Qwen-VL forward (vision tower into the ``<|image_pad|>`` rows, M-RoPE positions, Qwen3-VL's
        deepstack) with every hidden state: ``.logits [B, L, V]``, ``.hidden_states[-1]`` the states the ``[SEG]``
        prompt is read from (:attr:`seg_state_after_final_norm`)."""
        if pixel_values is not None:
            pixel_values = pixel_values.to(self.visual.dtype)
        return self.model(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values,
                          image_grid_thw=image_grid_thw, output_hidden_states=True, return_dict=True, **kwargs)
