"""The inputs of an upstream Sa2VA SFT run, read without upstream code (docs/upstream.md).

An upstream SFT config (``projects/llava_sam2/configs/sa2va_4b.py``) names:

* ``path``: the base InternVL2.5 directory (``config.json`` with ``vision_config`` / ``llm_config``, tokenizer,
  safetensors weights named ``vision_model.*``, ``language_model.*``, ``mlp1.*``), the ``model_path`` of ``mllm``;
* SAM2 weights: ``SAM2TrainRunner(ckpt_path='sam2_hiera_large.pt')`` loads ``pretrained/<ckpt_path>`` strictly,
  a ``torch.save``'d dict whose ``'model'`` (or ``'state_dict'``) holds the ``SAM2Base`` state in sam2 names;
* ``special_tokens`` (``[SEG] <p> </p> <vp> </vp>``), added to the base tokenizer; if any is new the LLM
  embeddings are resized to ``len(tokenizer)``;
* ``template`` (written into the HF ``config.json``) and ``llm_lora`` (peft ``LoraConfig``);
* ``pretrained_pth``: an XTuner checkpoint, read as xtuner's ``guess_load_checkpoint`` does (a file: the
  ``torch.load``'ed dict, or its ``'state_dict'``; a directory: a DeepSpeed checkpoint tag).

This module holds those descriptions as plain dataclasses and the readers of each file.
"""
from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..network.configuration import Sa2VAConfig
from ..text.constants import SA2VA_SPECIAL_TOKENS
from .deepspeed_zero import read_zero_checkpoint
from .hf_config import SA2VA_AUTO_MAP

# Upstream SAM2TrainRunner builds SAM 2.0 Hiera-L from this hydra config; no other size is known to us.
SAM2_CFG_PATHS = ("sam2_hiera_l.yaml",)


@dataclass(frozen=True)
class LoraSpec:
    """The SFT config's ``llm_lora`` (peft ``LoraConfig``); ΔW = scaling · B A with scaling = lora_alpha / r
    (lora_alpha / √r with ``use_rslora``)."""

    r: int
    lora_alpha: float
    lora_dropout: float = 0.0
    target_modules: tuple[str, ...] | None = None  # None: xtuner's default (every Linear but the head)
    use_rslora: bool = False
    modules_to_save: tuple[str, ...] = ()  # peft copies trained in full (codebase v2: embed_tokens, lm_head)

    def __post_init__(self) -> None:
        if self.r < 1 or self.lora_alpha <= 0:
            raise ValueError(f"llm_lora: need r >= 1 and lora_alpha > 0, got r={self.r}, lora_alpha={self.lora_alpha}")

    @property
    def scaling(self) -> float:
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)


@dataclass(frozen=True)
class UpstreamSFTSource:
    """Where an upstream SFT run's model comes from (engine/upstream_sft.py fills it from an SFT config).

    base_path: the InternVL2.5 directory (``mllm.model_path``); tokenizer_path defaults to it.
    pretrained_pth: the XTuner SFT checkpoint (``.pth`` file or DeepSpeed directory); None: base + SAM2 only.
    sam2_checkpoint: the SAM2 ``.pt``; None when ``pretrained_pth`` holds every SAM2 tensor (DeepSpeed dirs do).
    template: chat template name of the SFT config (e.g. ``phi3_chat``).
    grounding_config: SAM2 sizes (our extension, for tiny models); None: Hiera-L, or the base config.json's
        ``grounding_config`` key if present.
    init_checkpoint: codebase v2 only: the SFT config's own ``model.pretrained_pth``, the weights the SFT run
        started from (e.g. ``tools/convert_to_pth.py`` of a released Sa2VA), loaded by upstream *before* the LoRA
        wrap; its tensors stand between the SFT checkpoint and the SAM2 / base weights. None: no such layer.
    codebase: ``'v1'`` (``projects/llava_sam2``) or ``'v2'`` (``projects/sa2va``), told from the SFT config.
    family: ``'intern_vl'`` (``Sa2VAModel``) or ``'qwen_vl'`` (codebase v2's ``arch_type='qwen'``: ``base_path`` is a
        Qwen2.5-VL / Qwen3-VL directory, loaded into ``Sa2VAQwenModel`` by ``qwen_vl_sft``).
    """

    base_path: str
    template: str
    pretrained_pth: str | None = None
    sam2_checkpoint: str | None = None
    special_tokens: tuple[str, ...] = SA2VA_SPECIAL_TOKENS
    lora: LoraSpec | None = None
    tokenizer_path: str | None = None
    padding_side: str = "right"
    grounding_config: dict | None = None
    init_checkpoint: str | None = None
    codebase: str = "v1"
    family: str = "intern_vl"


# ---------------------------------------------------------------------------------------------- checkpoints
def read_xtuner_checkpoint(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict of an XTuner checkpoint, accepted as xtuner's ``guess_load_checkpoint`` accepts it: a file
    (``torch.load``; its ``'state_dict'`` when present) or a DeepSpeed checkpoint tag directory."""
    path = Path(path)
    if path.is_file():
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as err:
            raise ValueError(f"{path}: cannot read this checkpoint ({type(err).__name__}: {err})") from err
        state = loaded.get("state_dict", loaded) if isinstance(loaded, dict) else None
        if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
            found = sorted(loaded)[:8] if isinstance(loaded, dict) else type(loaded).__name__
            raise ValueError(f"{path}: not a state dict of tensors (top level: {found}); pass the iter_*.pth an XTuner "
                             "run wrote")
        return dict(state)
    if path.is_dir():
        return read_zero_checkpoint(path)
    raise FileNotFoundError(f"pretrained_pth {os.fspath(path)!r} does not exist (an XTuner .pth file or a "
                            "DeepSpeed checkpoint directory such as work_dirs/<config>/iter_5000.pth)")


def read_sam2_checkpoint(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """SAM2 weights in sam2 module names (``gamma``), as upstream's ``load_checkpoint_with_prefix`` reads them:
    the file's ``'state_dict'``, else its ``'model'``, else the dict itself."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SAM2 checkpoint {os.fspath(path)!r} does not exist; upstream reads "
                                "pretrained/sam2_hiera_large.pt (SAM2TrainRunner ckpt_path) relative to the run's "
                                "working directory")
    loaded = torch.load(path, map_location="cpu", weights_only=False)
    if isinstance(loaded, dict):
        loaded = loaded.get("state_dict", loaded.get("model", loaded))
    if not isinstance(loaded, dict) or not loaded or not all(torch.is_tensor(v) for v in loaded.values()):
        raise ValueError(f"{path}: expected a SAM2 state dict (or a dict with 'model'), got "
                         f"{type(loaded).__name__}")
    return dict(loaded)


# ---------------------------------------------------------------------------------------------- base model dir
def read_base_config(base_path: str | os.PathLike) -> dict:
    file = Path(base_path) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: mllm.model_path (the SFT config's `path`) must be the local "
                                "InternVL2.5 directory the SFT run started from")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{file}: not valid JSON ({err})") from err
    for key in ("vision_config", "llm_config"):
        if not isinstance(data.get(key), dict):
            raise ValueError(f"{file}: no {key!r} object; is {base_path} an InternVL chat model directory?")
    return data


def sa2va_config_from_base(base: dict, vocab_size: int, template: str,
                           grounding_config: dict | None = None) -> Sa2VAConfig:
    """The HF Sa2VA config upstream ``convert_to_hf.py`` derives from the base InternVL config: every base key,
    ``llm_config.vocab_size = len(tokenizer)``, ``template`` from the SFT config, Sa2VA's ``auto_map`` and
    ``architectures``; ``model_type`` becomes ``sa2va_chat`` when written."""
    data = copy.deepcopy(base)
    data["llm_config"]["vocab_size"] = int(vocab_size)
    data["template"] = template
    data["auto_map"] = dict(SA2VA_AUTO_MAP)
    data["architectures"] = ["Sa2VAChatModel"]
    for derived in ("model_type", "hidden_size", "tie_word_embeddings", "_name_or_path"):
        data.pop(derived, None)
    if grounding_config is not None:
        data["grounding_config"] = copy.deepcopy(grounding_config)
    return Sa2VAConfig.from_dict(data)


def load_sft_tokenizer(source: UpstreamSFTSource):
    """The base tokenizer plus the SFT config's special tokens (as ``InternVL_Slowfast._add_special_tokens``);
    returns (tokenizer, number of tokens that were new)."""
    from transformers import AutoTokenizer

    path = source.tokenizer_path or source.base_path
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer directory {path!r} does not exist (the SFT config's tokenizer "
                                "pretrained_model_name_or_path, normally the InternVL base `path`)")
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True, local_files_only=True,
                                              padding_side=source.padding_side)
    added = tokenizer.add_tokens(list(source.special_tokens), special_tokens=True)
    return tokenizer, added
