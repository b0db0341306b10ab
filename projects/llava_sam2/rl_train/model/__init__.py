"""Sa2VA re-implementation, in sub-packages by job (each one's docstring lists its modules)::

    pipeline/     the pipeline every caller runs (encode once, prompt, answer, masks), predict
    sft/          upstream SFT examples and loss
    checkpoints/  weights in and out: HF layout, upstream XTuner runs, DeepSpeed ZeRO directories
    decoding/     sampling, fast decoding, teacher-forced scoring, ids ↔ text
    network/      Sa2VAModel and its parts, LoRA, size presets
    text/         the inputs as data: tokens, prompts, tokenizer, tiling, processor

A sub-package imports only those below it on its list: text < network < decoding < pipeline;
checkpoints -> network, text; sft -> decoding, network, text (tests/test_model_layering.py checks it).

Public names are resolved lazily (PEP 562), and the sub-package ``__init__`` files import nothing, so importing
one module (e.g. ``model.text.prompts``) loads only what that module needs.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "Sa2VAConfig": ".network.configuration",
    "SubConfig": ".network.configuration",
    "SUPPORTED_LLM_ARCHITECTURES": ".network.configuration",
    "Sa2VAModel": ".network.sa2va",
    "GroundingFeatures": ".network.grounding",
    "MaskDecoderOutput": ".network.grounding",
    "build_preset": ".network.presets",
    "checkpoint_layout": ".checkpoints.hf_checkpoint",
    "checkpoint_state_dict": ".checkpoints.hf_checkpoint",
    "load_pretrained": ".checkpoints.hf_checkpoint",
    "save_pretrained": ".checkpoints.hf_checkpoint",
    "UpstreamSFTSource": ".checkpoints.upstream_base",
    "load_upstream_sft": ".checkpoints.xtuner_checkpoint",
    "xtuner_state_dict": ".checkpoints.xtuner_checkpoint",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
