"""Read an upstream Sa2VA SFT config (XTuner/MMEngine lazy config) for RL: the model it trains, never built.

The schema is upstream's ``projects/llava_sam2/configs/sa2va_4b.py`` (docs/upstream.md): top-level ``path``,
``template``, ``special_tokens``, ``pretrained_pth`` and a ``model`` dict

    model = dict(type=VideoLLaVASAMModel_zero3, special_tokens=..., frozen_sam2_decoder=False,
                 mllm=dict(type=InternVL_Slowfast, model_path=path, freeze_llm=True, freeze_visual_encoder=True,
                           llm_lora=dict(type=LoraConfig, r=128, lora_alpha=256, lora_dropout=0.05, ...),
                           special_tokens=...),
                 tokenizer=dict(type=AutoTokenizer.from_pretrained, pretrained_model_name_or_path=path, ...),
                 grounding_encoder=dict(type=SAM2TrainRunner[, cfg_path=..., ckpt_path=...]),
                 pretrained_pth=pretrained_pth, ...)

Codebase v2 (``projects/sa2va/configs/sa2va_in30_{2b,8b,14b}.py``, ``sa2va_finetune.py``) keeps these variables; its
model dict differs in

    model = dict(type=Sa2VAModel, training_bs=..., special_tokens=..., pretrained_pth=..., frozen_sam2_decoder=False,
                 mllm=dict(type=InternVLMLLM, model_path=path, freeze_llm=True, freeze_visual_encoder=True,
                           llm_lora=dict(type=LoraConfig, r=256, lora_alpha=512, lora_dropout=0.05, bias='none',
                                         task_type='CAUSAL_LM', modules_to_save=["embed_tokens", "lm_head"])),
                 tokenizer=..., grounding_encoder=dict(type=SAM2TrainRunner), ...)

so: the special tokens live only in ``model.special_tokens``; LoRA is always applied (upstream calls its LoRA
preparation unconditionally) and ``visual_encoder_lora`` is never applied; ``modules_to_save`` trains the
embeddings and LM head in full; SAM2 weights are read from ``pretrained/sam2/<ckpt_path>``; and ``pretrained_pth``
is the weights the SFT started from (loaded before the LoRA wrap), not a result. The codebase is told from the
class the model dict names (``Sa2VAModel``: v2, ``VideoLLaVASAMModel*``: v1), which both codebases' configs import
under those names.

Codebase v2's Qwen-VL family (``sa2va_qwenvl25/sa2va_qwen25_{3b,7b}.py``, ``sa2va_qwenvl3/sa2va_qwen3_4b.py``,
``sa2va_qwen_finetune.py``) is the same dict with ``arch_type='qwen'`` and ``mllm=dict(type=Qwen2_5_VL | Qwen3VL,
model_path=<a Qwen-VL directory>, freeze_llm=True, freeze_visual_encoder=True, llm_lora=dict(..., r=128,
lora_alpha=256, modules_to_save=['lm_head', 'embed_tokens'], target_modules=None))``; it loads into
``Sa2VAQwenModel`` (``model.checkpoints.qwen_vl_sft``). The family is told from ``arch_type`` and checked against the
mllm class.

Only plain values are read; the lazy ``type=`` objects are never imported, so the upstream classes need not be
importable (a config that imports them parses anywhere). An RL config embeds this dict as
``Sa2VATrainModel(upstream_sft=dict(sft_model=<the SFT model dict>, template=..., pretrained_pth=..., lora_mode=...))``.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..model.checkpoints.qwen_vl_sft import load_upstream_qwen_sft
from ..model.checkpoints.upstream_base import SAM2_CFG_PATHS, LoraSpec, UpstreamSFTSource, read_base_config
from ..model.checkpoints.xtuner_checkpoint import LORA_MODES, load_upstream_sft
from .mmengine_seams import stored_config_dict

# upstream projects/llava_sam2/models/sam2_train.py: BASE_DIR and the ckpt_path / cfg_path defaults
SAM2_BASE_DIR = "pretrained/"
SAM2_BASE_DIR_V2 = "pretrained/sam2/"  # projects/sa2va/models/sam2_train.py moved it
# the model class an SFT config's model dict names, per codebase
V1_MODEL_CLASSES = ("VideoLLaVASAMModel", "VideoLLaVASAMModel_zero3")
V2_MODEL_CLASSES = ("Sa2VAModel",)
# mllm classes per family: upstream's projects/sa2va/models/mllm/{internvl,qwenvl,qwen3vl}.py (v1: InternVL_Slowfast)
QWEN_MLLM_CLASSES = ("Qwen2_5_VL", "Qwen3VL")
INTERN_VL_MLLM_CLASSES = ("InternVLMLLM", "InternVL_Slowfast")
ARCH_TYPES = {"intern_vl": "intern_vl", "qwen": "qwen_vl"}  # Sa2VAModel arch_type -> our model family
SAM2_DEFAULT_CKPT = "sam2_hiera_large.pt"
SAM2_DEFAULT_CFG = "sam2_hiera_l.yaml"
# peft LoraConfig defaults for keys an llm_lora dict leaves out
PEFT_LORA_DEFAULTS = dict(r=8, lora_alpha=8, lora_dropout=0.0, target_modules=None, bias="none", use_rslora=False,
                          modules_to_save=None)
UPSTREAM_SFT_KEYS = ("sft_model", "template", "pretrained_pth", "lora_mode", "sam2_checkpoint")


@dataclass(frozen=True)
class SFTTrainFlags:
    """What the SFT config trained, mapped onto RL's trainable set (``model.network.lora.configure_trainable``)."""

    train_mask_decoder: bool  # not frozen_sam2_decoder
    has_llm_lora: bool
    sft_trained_embeddings: bool = False  # the SFT trained the embeddings / LM head (v2: llm_lora modules_to_save);
    # their trained values are loaded, and RL trains them only with its own train_embeddings=True


def plain(value: Any) -> Any:
    """A config value as plain dicts / lists, with lazy objects left unbuilt (``dict.items`` reads a ConfigDict's
    stored values; its own accessors would import them)."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in dict.items(value)}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(item) for item in value)
    return value


def _field(cfg: Mapping, key: str, default: Any = None) -> Any:
    return cfg.get(key, default) if isinstance(cfg, Mapping) else getattr(cfg, key, default)


def _lora_spec(llm_lora: Any) -> LoraSpec | None:
    """``llm_lora`` as a dict (``type=LoraConfig`` unbuilt) or a built peft LoraConfig."""
    if llm_lora is None:
        return None
    values = {key: _field(llm_lora, key, default) for key, default in PEFT_LORA_DEFAULTS.items()}
    if values["bias"] != "none":
        raise ValueError(f"SFT config llm_lora bias={values['bias']!r}: only bias='none' (upstream's) is supported")
    targets = values["target_modules"]
    targets = (targets,) if isinstance(targets, str) else (tuple(targets) if targets is not None else None)
    saved = values["modules_to_save"] or ()
    saved = (saved,) if isinstance(saved, str) else tuple(saved)
    unknown = sorted(set(saved) - {"embed_tokens", "lm_head"})
    if unknown:
        raise ValueError(f"SFT config llm_lora modules_to_save {list(saved)}: only embed_tokens and lm_head (codebase "
                         f"v2's) have a place in RL's model; unknown {unknown}")
    return LoraSpec(r=int(values["r"]), lora_alpha=float(values["lora_alpha"]),
                    lora_dropout=float(values["lora_dropout"]), target_modules=targets,
                    use_rslora=bool(values["use_rslora"]), modules_to_save=saved)


def _class_name(value: Any) -> str:
    """The class name a config's ``type=`` names: a lazy import (its ``str`` is the imported name), a class, or a
    dotted string."""
    name = value.__name__ if isinstance(value, type) else str(value)
    return name.rsplit(".", 1)[-1]


def sft_codebase(sft_model: Mapping) -> str:
    """``'v1'`` or ``'v2'``: the upstream codebase whose model class the SFT ``model`` dict names."""
    name = _class_name(_field(sft_model, "type", ""))
    if name in V2_MODEL_CLASSES:
        return "v2"
    if name in V1_MODEL_CLASSES:
        return "v1"
    raise ValueError(f"SFT config: model type {name!r} is neither codebase v1's {list(V1_MODEL_CLASSES)} "
                     f"(projects/llava_sam2) nor v2's {list(V2_MODEL_CLASSES)} (projects/sa2va)")


def sft_family(sft_model: Mapping, codebase: str) -> str:
    """``'intern_vl'`` or ``'qwen_vl'``: v2's ``arch_type`` (v1 has only InternVL), checked against the mllm class."""
    arch = sft_model.get("arch_type", "intern_vl")
    if arch not in ARCH_TYPES:
        raise ValueError(f"SFT config: arch_type={arch!r}; supported: {sorted(ARCH_TYPES)} (upstream's 'llava' has "
                         "no released config)")
    mllm_class = _class_name((sft_model.get("mllm") or {}).get("type", ""))
    family = ARCH_TYPES[arch]
    if family == "qwen_vl" and codebase != "v2":
        raise ValueError("SFT config: arch_type='qwen' with a codebase v1 model class; the Qwen-VL family exists only "
                         "in codebase v2 (projects/sa2va, model type Sa2VAModel)")
    known = QWEN_MLLM_CLASSES if family == "qwen_vl" else INTERN_VL_MLLM_CLASSES
    other = INTERN_VL_MLLM_CLASSES if family == "qwen_vl" else QWEN_MLLM_CLASSES
    if mllm_class in other:
        raise ValueError(f"SFT config: arch_type={arch!r} but model.mllm type {mllm_class!r}; upstream pairs "
                         f"arch_type={arch!r} with {list(known)}, so the config mixes the two families")
    return family


def sft_source(sft_model: Mapping, template: str, *, pretrained_pth: str | None = None,
               sam2_checkpoint: str | None = None) -> tuple[UpstreamSFTSource, SFTTrainFlags]:
    """The model description of an upstream SFT ``model`` dict (module docstring); ``pretrained_pth`` overrides the
    dict's own (an SFT config usually has None: the SFT *result* is what RL starts from)."""
    cfg = plain(sft_model)
    codebase = sft_codebase(cfg)
    mllm = cfg.get("mllm") or {}
    if "model_path" not in mllm:
        raise ValueError("SFT config: model.mllm.model_path (the InternVL / Qwen-VL base directory, `path`) is "
                         "missing; pass "
                         "the SFT config's `model` dict as upstream_sft.sft_model")
    if mllm.get("pretrained_pth") is not None:
        raise ValueError("SFT config: model.mllm.pretrained_pth is set; only the whole model's pretrained_pth "
                         "(XTuner checkpoint of VideoLLaVASAMModel) is supported")
    family = sft_family(cfg, codebase)
    # v2's InternVLMLLM never applies visual_encoder_lora (it passes None on and switches it off)
    trains_vit_lora = codebase == "v1" and mllm.get("visual_encoder_lora") is not None
    if not mllm.get("freeze_visual_encoder", False) or trains_vit_lora:
        raise ValueError("SFT config: the vision encoder was trained (freeze_visual_encoder=False or "
                         "visual_encoder_lora); RL keeps it frozen and upstream's checkpoints cannot hold it")
    lora = _lora_spec(mllm.get("llm_lora"))
    if codebase == "v2" and lora is None:
        raise ValueError("SFT config (codebase v2): model.mllm.llm_lora is None; v2's Sa2VAModel always wraps the LLM "
                         "with it, so a v2 run cannot have trained without one")
    if lora is None and not mllm.get("freeze_llm", False):
        raise ValueError("SFT config: full LLM fine-tuning (freeze_llm=False without llm_lora) is not supported; "
                         "upstream's state_dict raises NotImplementedError for it too")
    if codebase == "v2" and mllm.get("special_tokens") is not None:
        raise ValueError("SFT config (codebase v2): model.mllm.special_tokens is set, but v2's InternVLMLLM takes no "
                         "such argument (its tokens are model.special_tokens); is this a v1 config with a v2 model?")
    model_tokens, mllm_tokens = cfg.get("special_tokens"), mllm.get("special_tokens")
    if model_tokens and mllm_tokens and list(model_tokens) != list(mllm_tokens):
        raise ValueError(f"SFT config: model.special_tokens {list(model_tokens)} differ from model.mllm."
                         f"special_tokens {list(mllm_tokens)}; upstream resizes the LLM for the latter and writes the "
                         "vocabulary of the former, so the run is inconsistent")
    special = mllm_tokens or model_tokens or ["[SEG]"]  # upstream's default when neither is set
    tokenizer = cfg.get("tokenizer") or {}
    grounding = cfg.get("grounding_encoder") or {}
    sam2_dir = SAM2_BASE_DIR_V2 if codebase == "v2" else SAM2_BASE_DIR
    if codebase == "v2":  # the config's pretrained_pth is where the SFT started; the SFT result is given separately
        result, init = pretrained_pth, cfg.get("pretrained_pth")
    else:
        result, init = (pretrained_pth if pretrained_pth is not None else cfg.get("pretrained_pth")), None
    source = UpstreamSFTSource(
        base_path=os.fspath(mllm["model_path"]), template=template, pretrained_pth=result,
        sam2_checkpoint=sam2_checkpoint or os.path.join(sam2_dir, grounding.get("ckpt_path", SAM2_DEFAULT_CKPT)),
        special_tokens=tuple(special), lora=lora,
        tokenizer_path=tokenizer.get("pretrained_model_name_or_path"),
        padding_side=tokenizer.get("padding_side", "right"),
        init_checkpoint=os.fspath(init) if init is not None else None, codebase=codebase, family=family)
    cfg_path = grounding.get("cfg_path", SAM2_DEFAULT_CFG)
    if cfg_path not in SAM2_CFG_PATHS and "grounding_config" not in _base_config(source):
        raise ValueError(f"SFT config: grounding_encoder cfg_path={cfg_path!r}; only {list(SAM2_CFG_PATHS)} (SAM 2.0 "
                         "Hiera-L, Sa2VA's) is known")
    flags = SFTTrainFlags(train_mask_decoder=not cfg.get("frozen_sam2_decoder", True), has_llm_lora=lora is not None,
                          sft_trained_embeddings=lora is not None and (codebase == "v1" or bool(lora.modules_to_save)))
    return source, flags


def _base_config(source: UpstreamSFTSource) -> dict:
    if source.family == "intern_vl":
        return read_base_config(source.base_path)
    file = os.path.join(source.base_path, "config.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file} is missing: mllm.model_path must be the local Qwen-VL directory the SFT "
                                "run started from")
    with open(file, encoding="utf-8") as f:
        return json.load(f)


def build_upstream_sft_model(upstream_sft: Mapping, torch_dtype=None):
    """``Sa2VATrainModel(upstream_sft=...)``: (Sa2VAModel or Sa2VAQwenModel, tokenizer, SFTTrainFlags, LoadReport,
    UpstreamSFTSource)."""
    spec = plain(upstream_sft)
    unknown = sorted(set(spec) - set(UPSTREAM_SFT_KEYS))
    if unknown or "sft_model" not in spec or "template" not in spec:
        raise ValueError(f"upstream_sft: keys {sorted(spec)}; expected sft_model (the SFT config's model dict) and "
                         f"template, optionally pretrained_pth, lora_mode {LORA_MODES}, sam2_checkpoint "
                         f"(unknown: {unknown})")
    source, flags = sft_source(spec["sft_model"], spec["template"], pretrained_pth=spec.get("pretrained_pth"),
                               sam2_checkpoint=spec.get("sam2_checkpoint"))
    if source.pretrained_pth is None:
        raise ValueError("upstream_sft: pretrained_pth is None; set it to the SFT checkpoint RL starts from "
                         "(work_dirs/<sft config>/iter_N.pth, a file or a DeepSpeed directory)")
    load = load_upstream_qwen_sft if source.family == "qwen_vl" else load_upstream_sft
    model, tokenizer, report = load(source, lora_mode=spec.get("lora_mode", "keep"), torch_dtype=torch_dtype)
    return model, tokenizer, flags, report, source


def load_sft_config(path: str | os.PathLike, cfg_options: Mapping | None = None):
    """(UpstreamSFTSource, SFTTrainFlags) of an SFT config file (``model``, ``template``, ``pretrained_pth``)."""
    from mmengine.config import Config

    cfg = Config.fromfile(os.fspath(path))
    if cfg_options:
        cfg.merge_from_dict(dict(cfg_options))
    raw = stored_config_dict(cfg)
    if "model" not in raw or "template" not in raw:
        raise ValueError(f"{path}: an upstream Sa2VA SFT config defines `model` and `template`; this one has "
                         f"{sorted(raw)[:20]}")
    return sft_source(dict.__getitem__(raw, "model"), dict.__getitem__(raw, "template"))
