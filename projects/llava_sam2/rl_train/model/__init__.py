"""Sa2VA re-implementation: model, processor, checkpoint I/O, size presets.

Public names are resolved lazily (PEP 562) so that importing a light submodule such as
``model.tiling`` does not pull in torch, transformers and sam2.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "Sa2VAConfig": ".configuration",
    "SubConfig": ".configuration",
    "SUPPORTED_LLM_ARCHITECTURES": ".configuration",
    "Sa2VAModel": ".sa2va",
    "GroundingFeatures": ".grounding",
    "MaskDecoderOutput": ".grounding",
    "build_preset": ".presets",
    "checkpoint_layout": ".checkpoint",
    "checkpoint_state_dict": ".checkpoint",
    "load_pretrained": ".checkpoint",
    "save_pretrained": ".checkpoint",
    "UpstreamSFTSource": ".upstream_base",
    "load_upstream_sft": ".xtuner_checkpoint",
    "xtuner_state_dict": ".xtuner_checkpoint",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
