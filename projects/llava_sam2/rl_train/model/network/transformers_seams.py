"""The one module of ``model/`` that relies on transformers internals (``model/`` does not import ``engine/``, whose
``mmengine_seams.py`` holds the MMEngine ones).

What is here has no public equivalent in transformers 4.48. Each item reads or writes one attribute, named once below,
and has a canary in ``tests/test_model_seams.py`` that fails, naming the installed transformers version and
what changed, when an upgrade breaks the assumption.

* The attention kernel of a built model: every attention layer dispatches on ``config._attn_implementation`` at each
  call (``"eager"``, ``"sdpa"``, ``"flash_attention_2"`` or a name registered in ``ALL_ATTENTION_FUNCTIONS``), and a
  config offers no public setter once built. ``set_attention_implementation`` chooses the kernel of a config the
  language model is then built from (``language.hf_llm_config``); ``attention_implementation`` reads it (the grouped
  scorer supports only some kernels); ``using_attention`` switches a built model's kernel inside a block (the fast
  decoder's grouped-query decode step) and restores it.
* ``has_input_require_grads_hook(model)``: ``PreTrainedModel.enable_input_require_grads`` keeps its hook handle as
  ``model._require_grads_hook``; reading it tells whether the hook is already in place (LoRA with gradient
  checkpointing needs it once).
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn
from transformers import PretrainedConfig

ATTENTION_IMPLEMENTATION_ATTRIBUTE = "_attn_implementation"  # PretrainedConfig: the kernel the layers dispatch on
REQUIRE_GRADS_HOOK_ATTRIBUTE = "_require_grads_hook"  # PreTrainedModel.enable_input_require_grads: its hook handle


def attention_implementation(config: PretrainedConfig) -> str:
    """The attention kernel the model built from ``config`` runs (e.g. ``"sdpa"``)."""
    return getattr(config, ATTENTION_IMPLEMENTATION_ATTRIBUTE)


def set_attention_implementation(config: PretrainedConfig, name: str) -> None:
    """Make every attention layer of a model built from ``config`` run the kernel ``name``."""
    setattr(config, ATTENTION_IMPLEMENTATION_ATTRIBUTE, name)


@contextmanager
def using_attention(config: PretrainedConfig, name: str) -> Iterator[None]:
    """Run the attention kernel ``name`` inside the block; afterwards the one before (also after an error)."""
    previous = attention_implementation(config)
    set_attention_implementation(config, name)
    try:
        yield
    finally:
        set_attention_implementation(config, previous)


def has_input_require_grads_hook(model: nn.Module) -> bool:
    """True once ``model.enable_input_require_grads()`` has put its hook on the input embeddings."""
    return getattr(model, REQUIRE_GRADS_HOOK_ATTRIBUTE, None) is not None
