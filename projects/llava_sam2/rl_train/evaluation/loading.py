"""Build the model under evaluation: an HF-layout checkpoint directory, or a size preset (seeded random
init) with optional weights on top.

Weights files (``--weights``): ``.safetensors`` or a torch pickle (``.pt``/``.pth``/``.bin``) holding a
flat ``{name: tensor}`` dict, or an MMEngine checkpoint (its ``state_dict``). Names may use the HF
checkpoint layout (what ``save_pretrained`` writes) or the module layout (``model.state_dict()``), with
an optional ``sa2va.`` / ``module.`` prefix. A partial dict overlays only its tensors. LoRA tensors are
refused: merge them first (``Sa2VATrainModel.export_pretrained``) or evaluate the MMEngine checkpoint
with its config (``sa2va-rl evaluate --config``).
"""
from __future__ import annotations

import os

import torch

from ..model.checkpoints.hf_checkpoint import checkpoint_state_dict, load_pretrained, module_state_from_checkpoint
from ..model.network.presets import build_preset
from ..model.network.qwen_vl import Sa2VAQwenConfig, Sa2VAQwenModel
from ..model.network.sa2va import Sa2VAModel
from ..model.text.processor import Sa2VAProcessor
from ..model.text.qwen_processor import Sa2VAQwenProcessor
from ..model.text.tokenizer import sa2va_tokenizer

_PREFIXES = ("sa2va.", "module.")


def read_state_dict(path: str) -> dict[str, torch.Tensor]:
    """The {name: tensor} dict of a safetensors file, a torch pickle or an MMEngine checkpoint."""
    if not os.path.isfile(path):
        raise ValueError(f"weights file {path} does not exist")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    # Our own training outputs: MMEngine checkpoints also pickle their meta, so weights_only would refuse them.
    state = torch.load(path, map_location="cpu", weights_only=False)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise ValueError(f"{path}: expected a {{name: tensor}} state dict (or an MMEngine checkpoint with one)")
    return state


def load_weights(model: Sa2VAModel, path: str) -> int:
    """Overlay the tensors of ``path`` onto ``model`` (shapes checked); returns how many were loaded."""
    state = read_state_dict(path)
    for prefix in _PREFIXES:
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
    lora = [k for k in state if "lora_" in k or ".base_layer." in k]
    if lora:
        raise ValueError(f"{path}: holds LoRA tensors (e.g. {lora[0]!r}); evaluate it with its training config "
                         "(`sa2va-rl evaluate --config CFG --weights FILE`) or export merged weights first")
    module_keys = set(model.state_dict())
    checkpoint_keys = set(checkpoint_state_dict(model))
    if not set(state) <= module_keys:
        if not set(state) <= checkpoint_keys:
            unknown = sorted(set(state) - module_keys - checkpoint_keys)
            raise ValueError(f"{path}: {len(unknown)} tensors match neither the checkpoint nor the module layout of "
                             f"this model, e.g. {unknown[:3]}; is it for another preset?")
        state = module_state_from_checkpoint(model, state)
    own = model.state_dict()
    wrong = [(k, tuple(v.shape), tuple(own[k].shape)) for k, v in state.items() if v.shape != own[k].shape]
    if wrong:
        raise ValueError(f"{path}: shape mismatch, e.g. {wrong[0][0]} is {wrong[0][1]} but the model has {wrong[0][2]}")
    model.load_state_dict(state, strict=False)
    return len(state)


def load_system(*, checkpoint: str | None = None, preset: str | None = None, weights: str | None = None,
                init_seed: int = 0, tokenizer: str | None = None, device: str = "cpu",
                torch_dtype: torch.dtype | None = None, processor_overrides: dict | None = None
                ) -> tuple[Sa2VAModel | Sa2VAQwenModel, Sa2VAProcessor | Sa2VAQwenProcessor, dict]:
    """(model in eval mode with its tokenizer bound, processor, meta describing the source). A Qwen-VL family
    checkpoint gets the processor saved beside it (``Sa2VAQwenProcessor.from_pretrained``)."""
    if (checkpoint is None) == (preset is None):
        raise ValueError(f"load_system: give exactly one of checkpoint (HF-layout dir) and preset; got "
                         f"checkpoint={checkpoint!r}, preset={preset!r}")
    tok = sa2va_tokenizer(tokenizer or checkpoint, preset)
    if checkpoint is not None:
        model = load_pretrained(checkpoint, torch_dtype=torch_dtype, device=device)
        source = f"checkpoint {checkpoint}"
    else:
        torch.manual_seed(init_seed)
        config = build_preset(preset, vocab_size=len(tok))
        model = (Sa2VAQwenModel if isinstance(config, Sa2VAQwenConfig) else Sa2VAModel)(config)
        model.to(device=device, dtype=torch_dtype) if torch_dtype is not None else model.to(device)
        source = f"preset {preset} (init seed {init_seed})"
    if weights is not None:
        count = load_weights(model, weights)
        source += f" + {count} tensors from {weights}"
    model.bind_tokenizer(tok)
    overrides = dict(processor_overrides or {})
    if isinstance(model, Sa2VAQwenModel):
        processor = Sa2VAQwenProcessor.from_pretrained(checkpoint, model.config, **overrides) if checkpoint else \
            Sa2VAQwenProcessor.from_config(tok, model.config, **overrides)
    else:
        processor = Sa2VAProcessor.from_config(tok, model.config, **overrides)
    return model.eval(), processor, {"source": source}
