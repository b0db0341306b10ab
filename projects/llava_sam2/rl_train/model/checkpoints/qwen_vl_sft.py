"""Load an upstream codebase-v2 SFT run of the Qwen-VL family into ``Sa2VAQwenModel`` (docs/upstream.md).

Upstream's config (``projects/sa2va/configs/sa2va_qwenvl25/``, ``sa2va_qwenvl3/``) sets ``arch_type='qwen'`` and a
``Qwen2_5_VL`` / ``Qwen3VL`` mllm (``projects/sa2va/models/mllm/qwenvl.py``, ``qwen3vl.py``). That wrapper keeps the
whole transformers ``Qwen*VLForConditionalGeneration`` as ``mllm.model`` and, at LoRA preparation, peft-wraps that
*whole* model (not only its LLM, as the InternVL family does); with ``target_modules=None`` the targets are every
``nn.Linear`` under ``language_model``. Its ``state_dict`` is xtuner's ``get_peft_model_state_dict``: LoRA tensors of
adapter ``default`` and the ``modules_to_save`` copies (``lm_head``, ``embed_tokens``), nothing of the frozen vision
tower or its merger. ``Sa2VAModel.state_dict`` adds the SAM2 mask decoder and ``text_hidden_fcs``. Keys:

    mllm.model.base_model.model.<X>.lora_{A,B}.default.weight          LoRA of Qwen-VL layer <X>
    mllm.model.base_model.model.<X>.modules_to_save.default.<p>        <X>.<p>, trained copy (kept)
    mllm.model.base_model.model.<X>.original_module.<p>                frozen copy (DeepSpeed dirs only; dropped)
    mllm.model.base_model.model.<X>[.base_layer].<p>                   <X>.<p> (DeepSpeed dirs: the rest)
    grounding_encoder.sam2_model.<...>.gamma / text_hidden_fcs.<...>   as the InternVL family

with <X> a transformers Qwen-VL module name (``model.language_model.layers.0.self_attn.q_proj``, ``model.visual.*``,
``lm_head``). Our ``Sa2VAQwenModel`` keeps that model as ``model``, so <X> is ``model.<X>`` here: the map is a prefix
swap. A start checkpoint (the config's own ``model.pretrained_pth``, loaded before the LoRA wrap) has the same names
without ``base_model.model.``.

Sources, each tensor from the first that has it: the SFT checkpoint, the start checkpoint (adapter tensors skipped),
the SAM2 checkpoint, the base Qwen-VL directory (transformers' names, either the ``model.language_model.`` /
``model.visual.`` layout of transformers >= 4.52 or the older ``model.layers.`` / ``visual.`` one). Vocabulary and
LoRA modes as ``xtuner_checkpoint.load_upstream_sft``.
"""
from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import torch
from transformers.modeling_utils import no_init_weights

from ..network.qwen_vl import QWEN_VL_ARCHITECTURES, Sa2VAQwenConfig, Sa2VAQwenModel, is_qwen_vl_config
from .dtypes import as_torch_dtype, default_dtype
from .hf_checkpoint import _get_tensor, _open_safetensors, _weight_files, checkpoint_layout, read_layout
from .upstream_base import UpstreamSFTSource, load_sft_tokenizer, read_xtuner_checkpoint
from .xtuner_checkpoint import (LORA_MODES, LoadReport, _check_sft_weights, _drop_ignored, _fit_rows, _load_sam2,
                                _load_init, _load_weights, _merge_into,
                                check_lora_matches_config)
from .xtuner_keys import (ADAPTER, BASE_COPY, FCS, LAYOUT_V2, PEFT_PREFIX, SAM, SAVED_COPY, UpstreamState,
                          _put_llm_weight, _sam_to_hf, check_parsed_state)

QWEN_MLLM = "mllm.model."
# the Qwen-VL module parts an upstream checkpoint may name (transformers >= 4.52 layout)
QWEN_PARTS = ("model.language_model.", "model.visual.", "lm_head.")
_LORA = re.compile(r"^(?P<layer>.+)\.lora_(?P<ab>[AB])\.(?P<adapter>[^.]+)\.weight$")
_HEAD = "model.lm_head.weight"
_EMBED = "model.model.language_model.embed_tokens.weight"


def parse_qwen_upstream_state(state: dict[str, torch.Tensor], where: str = "checkpoint") -> UpstreamState:
    """Split a Qwen-VL-family upstream state dict (module docstring) into our names: ``weights`` keyed as
    ``Sa2VAQwenModel`` checkpoint names, ``lora_A`` / ``lora_B`` keyed by our module name (``model.model.language_
    model.layers.0.self_attn.q_proj``). Keys that fit no rule raise ValueError naming ``where`` and the keys."""
    out, unmapped, conflicts, base_copies = UpstreamState(layout=LAYOUT_V2), [], [], []
    plain_keys: dict[str, str] = {}
    for key, tensor in state.items():
        key = key.removeprefix("module.")
        if key.startswith(QWEN_MLLM):
            rest = key[len(QWEN_MLLM):]
            if rest.startswith(PEFT_PREFIX):
                out.is_llm_wrapped, rest = True, rest[len(PEFT_PREFIX):]
            lora = _LORA.match(rest)
            if not rest.startswith(QWEN_PARTS):
                unmapped.append(key)  # e.g. an InternVL checkpoint's mllm.model.vision_model / mlp1
            elif lora and lora["adapter"] == ADAPTER and rest.startswith("model.language_model."):
                (out.lora_A if lora["ab"] == "A" else out.lora_B)["model." + lora["layer"]] = tensor
            elif SAVED_COPY in rest and ".lora_" not in rest:
                module, param = rest.split(SAVED_COPY)
                out.saved_modules.add(module)
                _put_llm_weight(out.weights, f"model.{module}.{param}", tensor, key, plain_keys, conflicts)
            elif BASE_COPY in rest and ".lora_" not in rest:
                out.dropped_base_copies += 1
                base_copies.append(rest.split(BASE_COPY)[0])
            elif ".lora_" in rest or ".modules_to_save." in rest or lora:
                unmapped.append(key)  # other adapters, vision-tower LoRA
            else:
                _put_llm_weight(out.weights, "model." + rest.replace(".base_layer.", "."), tensor, key, plain_keys,
                                conflicts)
        elif key.startswith(SAM):
            out.weights[SAM + _sam_to_hf(key[len(SAM):])] = tensor
        elif key.startswith(FCS):
            out.weights[key] = tensor
        else:
            unmapped.append(key)
    orphans = sorted(set(base_copies) - out.saved_modules)
    unmapped += [f"{QWEN_MLLM}{PEFT_PREFIX}{m}{BASE_COPY}* (no {SAVED_COPY.strip('.')} copy)" for m in orphans]
    check_parsed_state(
        out, where, conflicts, unmapped, conflict_note="once plain and once as a peft modules_to_save copy",
        layout_note=f"do not map onto Sa2VA-Qwen: they do not fit the codebase-v2 Qwen-VL layout (expected "
                    f"{QWEN_MLLM}[{PEFT_PREFIX}]{{{', '.join(QWEN_PARTS)}}}..., {SAM}, {FCS}; LoRA only on "
                    f"model.language_model with peft adapter {ADAPTER!r})",
        hint="Is this an InternVL-family checkpoint (mllm.model.vision_model / mlp1)? Then the SFT config must not "
             "say arch_type='qwen'.")
    return out


def qwen_config_from_base(base_path: str | os.PathLike, vocab_size: int, template: str,
                          grounding_config: dict | None = None) -> Sa2VAQwenConfig:
    """The Sa2VA-Qwen config upstream's converter derives from the base Qwen-VL ``config.json``: every key, the text
    vocabulary resized to ``vocab_size``, ``template`` and Sa2VA's architecture name added."""
    file = Path(base_path) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: mllm.model_path (the SFT config's `path`) must be the local "
                                "Qwen-VL directory the SFT run started from")
    data = json.loads(file.read_text(encoding="utf-8"))
    if not is_qwen_vl_config(data):
        raise ValueError(f"{file}: not a Qwen-VL config (vision_config.model_type "
                         f"{(data.get('vision_config') or {}).get('model_type')!r}); the SFT config says arch_type="
                         "'qwen', whose model_path is a Qwen2.5-VL / Qwen3-VL directory")
    data = copy.deepcopy(data)
    (data.get("text_config") or data)["vocab_size"] = int(vocab_size)
    data.update(template=template, architectures=list(QWEN_VL_ARCHITECTURES))
    data.pop("_name_or_path", None)
    if grounding_config is not None:
        data["grounding_config"] = copy.deepcopy(grounding_config)
    return Sa2VAQwenConfig(data)


def base_key_to_ours(key: str) -> str | None:
    """A base Qwen-VL safetensors name → our checkpoint name (None: not a model tensor)."""
    if key.startswith(("model.language_model.", "model.visual.")):
        return "model." + key
    if key.startswith("visual."):  # transformers < 4.52 layout
        return "model.model." + key
    if key.startswith("model."):
        return "model.model.language_model." + key[len("model."):]
    if key == "lm_head.weight":
        return _HEAD
    return None


def load_upstream_qwen_sft(source: UpstreamSFTSource, lora_mode: str = "keep",
                           torch_dtype: str | torch.dtype | None = None, attn_implementation: str = "sdpa"):
    """``Sa2VAQwenModel`` from an upstream Qwen-VL SFT run; (model, tokenizer, LoadReport). In ``'keep'`` mode the
    Qwen-VL model comes back peft-wrapped with the SFT adapter (``Sa2VAQwenModel.apply_lora``'s targets)."""
    if lora_mode not in LORA_MODES:
        raise ValueError(f"lora_mode={lora_mode!r}; use 'keep' (continue the SFT adapter) or 'merge' (fold it in)")
    tokenizer, added = load_sft_tokenizer(source)
    base_files = _weight_files(Path(source.base_path))
    base_layout, _, _ = read_layout(base_files)
    base_names = {k: base_key_to_ours(k) for k in base_layout}
    embed = [k for k, ours in base_names.items() if ours == _EMBED]
    if not embed:
        raise ValueError(f"{source.base_path}: no embed_tokens weight in the safetensors; not a Qwen-VL directory")
    base_rows = base_layout[embed[0]][0]
    vocab = len(tokenizer) if added else base_rows
    config = qwen_config_from_base(source.base_path, vocab, source.template, source.grounding_config)
    with default_dtype(as_torch_dtype(torch_dtype) or torch.float32), no_init_weights():
        model = Sa2VAQwenModel(config, attn_implementation=attn_implementation)
    where = os.fspath(source.pretrained_pth) if source.pretrained_pth else "pretrained_pth"
    sft = parse_qwen_upstream_state(_drop_ignored(read_xtuner_checkpoint(source.pretrained_pth)), where) \
        if source.pretrained_pth else UpstreamState(layout=LAYOUT_V2)
    report = LoadReport(lora_mode=lora_mode if sft.lora_A else "none", layout="v2-qwen")
    if vocab != base_rows:
        report.vocab = (base_rows, vocab)
    expected = checkpoint_layout(model)
    _check_sft_weights(sft.weights, expected, where, base_rows, vocab)
    loaded = _load_weights(model, sft.weights, "checkpoint", report)
    loaded |= _load_init(model, source, expected, loaded, base_rows, vocab, report, parse=parse_qwen_upstream_state)
    loaded |= _load_sam2(model, source, expected, loaded, report)
    loaded |= _load_base(model, base_files, base_names, expected, loaded, vocab, report)
    missing = [k for k in expected if k not in loaded]
    if missing:
        raise ValueError(f"{where}: {len(missing)} tensors are in neither the SFT checkpoint, the SAM2 checkpoint nor "
                         f"{source.base_path}: {missing[:20]} (text_hidden_fcs comes only from the SFT checkpoint: "
                         "is pretrained_pth a Sa2VA SFT checkpoint?)")
    _apply_lora(model, sft, source, lora_mode, report)
    return model.train(), tokenizer, report


def _load_base(model, files, base_names, expected, loaded, vocab, report) -> set[str]:
    """Base Qwen-VL tensors for what is still missing; a tied base (no ``lm_head.weight``, e.g. Qwen3-VL-4B) gives
    the head its embedding rows, as the tie does."""
    done: set[str] = set()
    for file in files:
        with _open_safetensors(file) as handle:
            chunk = {}
            for key in handle.keys():
                ours = base_names.get(key)
                if ours in expected and ours not in loaded:
                    chunk[ours] = _fit_rows(ours, _get_tensor(handle, key, file), vocab, report)
                    if ours == _EMBED and _HEAD in expected and _HEAD not in loaded \
                            and _HEAD not in base_names.values():
                        chunk[_HEAD] = chunk[ours].clone()
        done |= _load_weights(model, chunk, "base", report)
    if _HEAD in done and _HEAD not in base_names.values():
        report.lm_head_tied = True  # the base was tied; our model keeps an untied copy
    return done


def _apply_lora(model: Sa2VAQwenModel, sft: UpstreamState, source: UpstreamSFTSource, lora_mode: str,
                report: LoadReport) -> None:
    if not sft.lora_A:
        return
    check_lora_matches_config(sft, source)
    report.lora_layers = len(sft.lora_A)
    if lora_mode == "merge":
        with torch.no_grad():
            for name, lora_a in sft.lora_A.items():
                _merge_into(model.get_submodule(name), lora_a, sft.lora_B[name], source.lora.scaling)
        return
    if source.lora.use_rslora:
        raise NotImplementedError("keep mode with use_rslora: Sa2VAQwenModel.apply_lora has no rslora switch; use "
                                  "lora_mode='merge'")
    model.apply_lora(r=source.lora.r, lora_alpha=source.lora.lora_alpha, lora_dropout=source.lora.lora_dropout)
    body = model.model.base_model.model  # the Qwen-VL model inside peft: module names as upstream's <X>
    wrapped = {"model." + n for n, module in body.named_modules() if hasattr(module, "lora_A")}
    stray, unset = sorted(set(sft.lora_A) - wrapped), sorted(wrapped - set(sft.lora_A))
    if stray or unset:
        raise ValueError(f"{source.pretrained_pth}: LoRA layers of the checkpoint {stray[:10]} are not LoRA targets "
                         f"here, and targets {unset[:10]} have no LoRA in the checkpoint; upstream's Qwen-VL SFT "
                         "(target_modules=None) adapts every Linear of the text decoder: use lora_mode='merge' for "
                         "another target set")
    with torch.no_grad():
        for name, lora_a in sft.lora_A.items():
            module = body.get_submodule(name[len("model."):])
            module.lora_A[ADAPTER].weight.copy_(lora_a)
            module.lora_B[ADAPTER].weight.copy_(sft.lora_B[name])
