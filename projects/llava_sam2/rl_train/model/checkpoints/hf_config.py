"""The ``config.json`` fields upstream's HF readers need, so a checkpoint we write loads in upstream's code.

Upstream's codebase-v2 ``Sa2VAChatConfig`` (the one Sa2VA-InternVL3 checkpoints ship) decides what it builds from two
fields: with no top-level ``architectures`` it assumes a Qwen2.5-VL model, and a ``vision_config`` without
``architectures`` is replaced by a default vision config, dropping every size it held (docs/sa2va_internals.md §9).
The first release's reader ignored both, so a config that came through it may lack them; ``save_pretrained`` fills
them in, with Sa2VA's ``auto_map`` (the remote-code entry points ``trust_remote_code`` loads).
"""
from __future__ import annotations

from ..network.configuration import Sa2VAConfig

SA2VA_ARCHITECTURES = ["Sa2VAChatModel"]
INTERNVIT_ARCHITECTURES = ["InternVisionModel"]
SA2VA_AUTO_MAP = {
    "AutoConfig": "configuration_sa2va_chat.Sa2VAChatConfig",
    "AutoModel": "modeling_sa2va_chat.Sa2VAChatModel",
    "AutoModelForCausalLM": "modeling_sa2va_chat.Sa2VAChatModel",
}


def with_upstream_class_fields(config: Sa2VAConfig) -> Sa2VAConfig:
    """A copy of ``config`` with ``architectures``, ``auto_map`` and ``vision_config.architectures`` present; values
    the config already holds are kept."""
    out = config.copy()
    out.extra.setdefault("architectures", list(SA2VA_ARCHITECTURES))
    out.extra.setdefault("auto_map", dict(SA2VA_AUTO_MAP))
    if not out.vision_config.get("architectures"):
        out.vision_config.architectures = list(INTERNVIT_ARCHITECTURES)
    return out
