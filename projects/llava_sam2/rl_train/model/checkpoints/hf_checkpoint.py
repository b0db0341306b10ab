"""Checkpoint I/O in the upstream HF Sa2VA layout: ``config.json`` + ``model.safetensors`` (or shards
with ``model.safetensors.index.json``).

Module names differ from checkpoint names in exactly these places, all listed here:
* ``SAM2_CHECKPOINT_RENAMES``: the sam2 package's CXBlock layer scale ``.gamma`` is ``.g_weight`` in HF
  checkpoints (Sa2VA's converter renamed it; docs/sa2va_internals.md §1.7, §8.4).
* ``language.LanguageKeyMap``: InternLM2 keys ↔ the Llama modules we build (identity for Qwen2/Phi3/Llama).
* A peft-wrapped LLM (``base_model.model.`` prefix, ``.base_layer``, ``lora_*``, ``modules_to_save``) is
  written merged, W' = W + scale·B@A, without touching the live weights.
* A model whose LM head was tied at load (checkpoint without ``lm_head``) is saved without it again.

The Qwen-VL family (``network.qwen_vl``: upstream's ``Sa2VAChatModelQwen`` layout) goes through the same functions: its
module names are its checkpoint names except the SAM2 rename, and its config.json is the Qwen-VL config itself
(recognised by ``qwen_vl.is_qwen_vl_config``).

``config.json`` always carries the class fields upstream's codebase-v2 reader needs (``hf_config``).
"""
from __future__ import annotations

import json
import os
import re
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn
from transformers.modeling_utils import no_init_weights

from ..network.configuration import Sa2VAConfig
from ..network.language import LanguageKeyMap
from ..network.qwen_vl import Sa2VAQwenConfig, Sa2VAQwenModel, is_qwen_vl_config
from ..network.sa2va import Sa2VAModel
from .dtypes import as_torch_dtype, default_dtype
from .hf_config import with_upstream_class_fields

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"

# (module-name suffix, checkpoint-name suffix) under ``grounding_encoder.``.
SAM2_CHECKPOINT_RENAMES = [(".gamma", ".g_weight")]

_LM = "language_model."
_SAM = "grounding_encoder."
_MAX_LISTED = 30


# ---------------------------------------------------------------------------------------------- names
def _sam_to_checkpoint(key: str) -> str:
    for module_suffix, ckpt_suffix in SAM2_CHECKPOINT_RENAMES:
        if key.endswith(module_suffix):
            return key[: -len(module_suffix)] + ckpt_suffix
    return key


def _sam_to_module(key: str) -> str:
    for module_suffix, ckpt_suffix in SAM2_CHECKPOINT_RENAMES:
        if key.endswith(ckpt_suffix):
            return key[: -len(ckpt_suffix)] + module_suffix
    return key


def _merged_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """State dict of ``module`` with any peft wrapping removed and LoRA deltas merged (a new tensor;
    the live weights are not modified)."""
    try:
        from peft import PeftModel
        from peft.tuners.lora import LoraLayer
        from peft.utils.other import ModulesToSaveWrapper
    except ImportError:  # peft absent: nothing can be wrapped
        return dict(module.state_dict())
    base = module.get_base_model() if isinstance(module, PeftModel) else module
    state = dict(base.state_dict())
    for prefix, sub in base.named_modules():
        dot = prefix + "." if prefix else ""
        if isinstance(sub, ModulesToSaveWrapper):
            active = sub.active_adapters[0] if not sub.disable_adapters else None
            _collapse(state, dot, keep=f"{dot}modules_to_save.{active}." if active else f"{dot}original_module.")
        elif isinstance(sub, LoraLayer):
            _merge_lora(state, dot, sub)
    leftovers = [k for k in state if ".lora_" in k or ".base_layer." in k or ".modules_to_save." in k]
    if leftovers:
        raise NotImplementedError(f"cannot export these adapter tensors (unsupported peft layer): {leftovers[:5]}")
    return state


def _collapse(state: dict[str, torch.Tensor], dot: str, keep: str) -> None:
    """Replace ``<dot>{original_module,modules_to_save.*}.X`` keys by ``<dot>X`` from ``keep``."""
    for key in [k for k in state if k.startswith(dot + "original_module.") or k.startswith(dot + "modules_to_save.")]:
        tensor = state.pop(key)
        if key.startswith(keep):
            state[dot + key[len(keep):]] = tensor


def _merge_lora(state: dict[str, torch.Tensor], dot: str, layer) -> None:
    """``<dot>base_layer.weight`` + Σ_active scale·B@A → ``<dot>weight``; drop ``<dot>lora_*``."""
    pending = [] if layer.disable_adapters else [a for a in layer.active_adapters if a not in layer.merged_adapters]
    for adapter in pending:
        if layer.use_dora.get(adapter, False):
            raise NotImplementedError(f"{dot}: exporting DoRA adapters is not supported")
    for key in [k for k in state if k.startswith(dot)]:
        rest = key[len(dot):]
        if rest.startswith("lora_"):
            state.pop(key)
        elif rest.startswith("base_layer."):
            tensor = state.pop(key)
            name = rest[len("base_layer."):]
            if name == "weight":
                for adapter in pending:
                    tensor = tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
            state[dot + name] = tensor


def _module_state(model: Sa2VAModel | Sa2VAQwenModel) -> dict[str, torch.Tensor]:
    """Full state in module names (language_model unwrapped and merged), checkpoint order."""
    out: dict[str, torch.Tensor] = {}
    for child_name, child in model.named_children():
        for key, tensor in _merged_state(child).items():
            out[f"{child_name}.{key}"] = tensor
    if model.lm_head_tied:
        out.pop(_LM + "lm_head.weight", None)
    return out


def checkpoint_state_dict(model: Sa2VAModel | Sa2VAQwenModel) -> dict[str, torch.Tensor]:
    """Module state → checkpoint names (see the module docstring for every rename)."""
    if isinstance(model, Sa2VAQwenModel):
        return {(_sam_to_checkpoint(k) if k.startswith(_SAM) else k): v for k, v in _module_state(model).items()}
    lm_map = LanguageKeyMap(model.config.llm_config)
    state = _module_state(model)
    lm_part = {k[len(_LM):]: v for k, v in state.items() if k.startswith(_LM)}
    lm_ckpt = {_LM + k: v for k, v in lm_map.to_checkpoint(lm_part).items()}
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if key.startswith(_LM):
            if lm_ckpt:  # insert the whole LLM block where it starts, keeping module order
                out.update(lm_ckpt)
                lm_ckpt = {}
        elif key.startswith(_SAM):
            out[_sam_to_checkpoint(key)] = tensor
        else:
            out[key] = tensor
    return out


def checkpoint_layout(model: Sa2VAModel | Sa2VAQwenModel) -> dict[str, tuple[int, ...]]:
    """{checkpoint key: shape} of what ``save_pretrained`` writes; works on a meta-device model."""
    return {key: tuple(tensor.shape) for key, tensor in checkpoint_state_dict(model).items()}


def module_state_from_checkpoint(model: Sa2VAModel | Sa2VAQwenModel, state: dict[str, torch.Tensor]
                                 ) -> dict[str, torch.Tensor]:
    if isinstance(model, Sa2VAQwenModel):
        return {(_sam_to_module(k) if k.startswith(_SAM) else k): v for k, v in state.items()}
    lm_map = LanguageKeyMap(model.config.llm_config)
    lm_part = {k[len(_LM):]: v for k, v in state.items() if k.startswith(_LM)}
    out = {_LM + k: v for k, v in lm_map.to_module(lm_part).items()}
    for key, tensor in state.items():
        if key.startswith(_SAM):
            out[_sam_to_module(key)] = tensor
        elif not key.startswith(_LM):
            out[key] = tensor
    return out


# ---------------------------------------------------------------------------------------------- reading
def _weight_files(path: Path) -> list[Path]:
    index = path / WEIGHTS_INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{index}: not a safetensors index with a 'weight_map' ({err})") from err
        files = [path / name for name in dict.fromkeys(weight_map.values())]
        for file in files:
            if not file.is_file():
                raise FileNotFoundError(f"{index} lists shard {file.name}, which does not exist in {path}")
        return files
    single = path / WEIGHTS_NAME
    if single.is_file():
        return [single]
    raise FileNotFoundError(f"{path}: no {WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME}; is this a Sa2VA HF checkpoint dir?")


@contextmanager
def _open_safetensors(file: Path) -> Iterator:
    """``safe_open`` whose read errors (bad header, truncated data) name the file."""
    try:
        handle = safe_open(str(file), framework="pt", device="cpu")
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{file}: cannot read safetensors ({err}); the file is corrupt or truncated, re-save it") from err
    with handle:
        yield handle


def _get_tensor(handle, key: str, file: Path) -> torch.Tensor:
    try:
        return handle.get_tensor(key)
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{file}: cannot read tensor {key!r} ({err}); the file is corrupt, re-save it") from err


def read_layout(files: list[Path]) -> tuple[dict[str, tuple[int, ...]], dict[str, Path], Counter]:
    """Header-only scan: {key: shape}, {key: file}, Counter of float dtypes."""
    shapes, where, dtypes = {}, {}, Counter()
    for file in files:
        with _open_safetensors(file) as handle:
            for key in handle.keys():
                if key in where:
                    raise ValueError(f"tensor {key!r} appears in both {where[key].name} and {file.name}")
                sl = handle.get_slice(key)
                shapes[key], where[key] = tuple(sl.get_shape()), file
                dtypes[sl.get_dtype()] += 1
    return shapes, where, dtypes


def check_layout(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], path: Path,
                 optional: set[str] = frozenset()) -> None:
    """Raise ValueError listing missing keys, unexpected keys and shape mismatches."""
    missing = [k for k in expected if k not in found and k not in optional]
    unexpected = [k for k in found if k not in expected]
    mismatched = [f"{k}: checkpoint {found[k]} vs model {expected[k]}" for k in expected
                  if k in found and tuple(found[k]) != tuple(expected[k])]
    if not (missing or unexpected or mismatched):
        return
    lines = [f"{path}: checkpoint does not match the model built from its config.json"]
    for title, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mismatched)):
        if items:
            shown = "\n    ".join(items[:_MAX_LISTED])
            more = f"\n    ... and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else ""
            lines.append(f"  {title} ({len(items)}):\n    {shown}{more}")
    raise ValueError("\n".join(lines))


_SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def load_pretrained(path: str | os.PathLike, torch_dtype: str | torch.dtype | None = None,
                    device: str | torch.device | None = None, attn_implementation: str = "sdpa"
                    ) -> Sa2VAModel | Sa2VAQwenModel:
    """Build from ``config.json`` and load every tensor strictly: a :class:`Sa2VAModel` (InternVL family) or, for a
    Sa2VA-Qwen config.json, a :class:`Sa2VAQwenModel`.

    ``torch_dtype``: a ``torch.dtype`` or its name (``'bfloat16'``, ``dtypes.DTYPES``); None keeps the
    checkpoint's floating dtype when it has one (else float32).
    A checkpoint without the LM head gets it tied to the input embeddings (§8.10).
    """
    path = Path(path)
    config_file = path / CONFIG_NAME
    if not config_file.is_file():
        raise FileNotFoundError(f"{path}: no {CONFIG_NAME}; expected a Sa2VA HF checkpoint directory")
    config = _read_config(config_file)
    model_cls = Sa2VAQwenModel if isinstance(config, Sa2VAQwenConfig) else Sa2VAModel
    files = _weight_files(path)
    found, where, dtypes = read_layout(files)
    float_dtypes = [d for d in dtypes if d in _SAFETENSORS_DTYPES]
    torch_dtype = as_torch_dtype(torch_dtype)
    if torch_dtype is None:
        torch_dtype = _SAFETENSORS_DTYPES[float_dtypes[0]] if len(float_dtypes) == 1 else torch.float32
    device = torch.device(device or "cpu")
    with torch.device(device), default_dtype(torch_dtype), no_init_weights():
        model = model_cls(config, attn_implementation=attn_implementation)
    # No model.to(torch_dtype): it would also cast fp32 buffers such as the RoPE inv_freq.
    if isinstance(model, Sa2VAQwenModel):  # upstream's converter always writes the head (tie_word_embeddings False)
        check_layout(checkpoint_layout(model), found, path)
    else:
        lm_head_key = _LM + LanguageKeyMap(config.llm_config).lm_head_key()
        check_layout(checkpoint_layout(model), found, path, optional={lm_head_key})
    if not isinstance(model, Sa2VAQwenModel) and lm_head_key not in found:
        model.language_model.config.tie_word_embeddings = True
        model.language_model.tie_weights()
        model.lm_head_tied = True
    for file in files:
        with _open_safetensors(file) as handle:
            state = {key: _get_tensor(handle, key, file) for key in handle.keys()}
        result = model.load_state_dict(module_state_from_checkpoint(model, state), strict=False)
        if result.unexpected_keys:
            raise ValueError(f"{file}: keys not in the model: {result.unexpected_keys[:_MAX_LISTED]}")
    return model.eval()  # as transformers' from_pretrained; call .train() to fine-tune


def _read_config(config_file: Path) -> Sa2VAConfig | Sa2VAQwenConfig:
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_file}: not valid JSON ({err}); re-export the checkpoint's config.json") from err
    if isinstance(data, dict) and is_qwen_vl_config(data):
        return Sa2VAQwenConfig.from_json_file(config_file)
    return Sa2VAConfig.from_json_file(config_file)


# ---------------------------------------------------------------------------------------------- writing
def parse_size(size: int | str) -> int:
    """'5GB' → 5·10⁹ bytes (HF convention: decimal units); ints pass through."""
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?B)\s*", str(size).upper())
    if not match:
        raise ValueError(f"max_shard_size={size!r}; expected bytes as an int or a string like '5GB' / '500MB'")
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}[match.group(2)]
    return int(float(match.group(1)) * scale)


def _shards(state: dict[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += nbytes
    return shards


def save_pretrained(model: Sa2VAModel | Sa2VAQwenModel, path: str | os.PathLike,
                    max_shard_size: int | str = "5GB") -> None:
    """Write config.json and the weights in checkpoint names (LoRA merged, copies on CPU).

    config.json gains ``architectures`` / ``auto_map`` / ``vision_config.architectures`` when the config lacks them
    (``hf_config``: upstream's v2 reader builds the wrong model without them).

    config.json's ``torch_dtype`` is the dtype of the first floating tensor written (the ViT's, as transformers
    records the first floating parameter), whatever the config held: a model built from a bf16 checkpoint's config
    but kept in fp32 says float32."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = checkpoint_state_dict(model)
    if any(t.is_meta for t in state.values()):
        raise ValueError("save_pretrained: the model has meta tensors (built for shapes only); load weights first")
    for stale in [path / WEIGHTS_NAME, path / WEIGHTS_INDEX_NAME, *path.glob("model-*-of-*.safetensors")]:
        stale.unlink(missing_ok=True)
    shards = _shards(state, parse_size(max_shard_size))
    names = [WEIGHTS_NAME] if len(shards) == 1 else \
        [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map, total = {}, 0
    for name, shard in zip(names, shards):
        seen: set[int] = set()
        cpu = {}
        for key, tensor in shard.items():
            tensor = tensor.detach().to("cpu").contiguous()
            if tensor.data_ptr() in seen and tensor.numel():  # shared storage is rejected by safetensors
                tensor = tensor.clone()
            seen.add(tensor.data_ptr())
            cpu[key] = tensor
            weight_map[key] = name
            total += tensor.numel() * tensor.element_size()
        save_file(cpu, str(path / name), metadata={"format": "pt"})
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (path / WEIGHTS_INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    first_float = next((t for t in state.values() if t.is_floating_point()), None)
    dtype_name = None if first_float is None else str(first_float.dtype).removeprefix("torch.")
    if isinstance(model, Sa2VAQwenModel):  # to_dict adds upstream's architectures / auto_map where missing
        config = model.config.copy()
        if dtype_name is not None:
            config.data["torch_dtype" if "torch_dtype" in config.data else "dtype"] = dtype_name
        config.to_json_file(path / CONFIG_NAME)
        return
    config = with_upstream_class_fields(model.config)
    if dtype_name is not None:
        config.extra["torch_dtype"] = dtype_name
    config.to_json_file(path / CONFIG_NAME)
