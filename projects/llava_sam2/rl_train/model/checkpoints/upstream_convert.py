"""Conversions between an upstream XTuner SFT run and the HF Sa2VA layout, without upstream code.

* ``sft_to_hf``: what upstream ``projects/llava_sam2/hf/convert_to_hf.py CONFIG PTH --save-path DIR`` writes —
  LoRA merged, ``mllm.model.`` dropped, ``.gamma`` → ``.g_weight``, ``config.json`` = the base InternVL config with
  ``llm_config.vocab_size = len(tokenizer)``, the SFT ``template`` and Sa2VA's ``auto_map``; the tokenizer with
  the special tokens; and (as upstream's ``cp projects/llava_sam2/hf/models/*``) the remote-code ``*.py`` files
  when a folder holding them is given.
* ``xtuner_checkpoint.xtuner_state_dict`` / ``save_xtuner_checkpoint``: the reverse direction.

dtype (``dtype='auto'``, what upstream's converter writes): ``vision_model`` in the base config's ``torch_dtype``;
``language_model`` in float32 when the SFT config has ``llm_lora`` (xtuner runs peft's
``prepare_model_for_kbit_training`` on the LLM, which casts every bf16/fp16 parameter to fp32, and the LoRA merge
happens there, so the merged weights keep fp32 precision), else in the base dtype; ``mlp1``, ``grounding_encoder`` and ``text_hidden_fcs`` in float32.
A dtype name writes every tensor in it.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from ..network.sa2va import Sa2VAModel
from .dtypes import as_torch_dtype
from .hf_checkpoint import save_pretrained
from .upstream_base import UpstreamSFTSource, read_base_config
from .xtuner_checkpoint import load_upstream_sft


def apply_hf_dtype(model: Sa2VAModel, dtype: str, base_dtype: str | None, *, has_llm_lora: bool = True) -> None:
    """Cast parameters for writing: ``'auto'`` as upstream's converter (module docstring; ``has_llm_lora``: the SFT
    config has ``llm_lora``, so upstream's LLM is fp32), else all to ``dtype``."""
    if dtype != "auto":
        model.to(as_torch_dtype(dtype, "dtype"))
        return
    base = as_torch_dtype(base_dtype or "bfloat16", "the base config's torch_dtype")
    model.vision_model.to(base)
    model.language_model.to(torch.float32 if has_llm_lora else base)
    for part in (model.mlp1, model.grounding_encoder, model.text_hidden_fcs):
        part.to(torch.float32)


def copy_remote_code(remote_code_dir: str | os.PathLike, save_path: str | os.PathLike) -> list[str]:
    """Copy the ``*.py`` files of upstream's ``projects/llava_sam2/hf/models`` next to the weights, as upstream's
    converter does, so ``AutoModel.from_pretrained(..., trust_remote_code=True)`` works."""
    source = Path(remote_code_dir)
    files = sorted(source.glob("*.py"))
    if not files:
        raise FileNotFoundError(f"{source}: no *.py files; pass the Sa2VA checkout's projects/llava_sam2/hf/models")
    for file in files:
        shutil.copy2(file, Path(save_path) / file.name)
    return [file.name for file in files]


def sft_to_hf(source: UpstreamSFTSource, save_path: str | os.PathLike, *, dtype: str = "auto",
              max_shard_size: int | str = "5GB", remote_code_dir: str | os.PathLike | None = None):
    """Write the HF Sa2VA layout of an upstream SFT run (LoRA merged); returns the LoadReport."""
    if source.family != "intern_vl":
        raise ValueError(f"convert to-hf: the SFT run is of the {source.family} family (arch_type='qwen'); only the "
                         "InternVL family's runs are converted here. Start RL from it (upstream_sft) and write the "
                         "result with `sa2va-rl export`, or use upstream's tools/convert_to_hf.py")
    model, tokenizer, report = load_upstream_sft(source, lora_mode="merge")
    apply_hf_dtype(model, dtype, read_base_config(source.base_path).get("torch_dtype"),
                   has_llm_lora=source.lora is not None)
    save_pretrained(model, save_path, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(os.fspath(save_path))
    if remote_code_dir is not None:
        copy_remote_code(remote_code_dir, save_path)
    return report
