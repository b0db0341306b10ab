"""The one module of ``model/`` that relies on transformers internals (``model/`` does not import ``engine/``, whose
``mmengine_seams.py`` holds the MMEngine ones).

Written against transformers 4.57 (the pinned stack, docs/stack.md). What is here has no stable public equivalent:
each item reads or writes one attribute or calling convention, named once below, and has a canary in
``tests/test_model_seams.py`` that fails, naming the installed transformers version and what changed, when an upgrade
breaks the assumption.

* The attention kernel of a built model: every attention layer dispatches on ``config._attn_implementation`` at each
  call (``"eager"``, ``"sdpa"``, ``"flash_attention_2"`` or a name registered in ``ALL_ATTENTION_FUNCTIONS``), and a
  config offers no public setter once built. ``set_attention_implementation`` chooses the kernel of a config the
  language model is then built from (``language.hf_llm_config``); ``attention_implementation`` reads it (the grouped
  scorer supports only some kernels); ``using_attention`` switches a built model's kernel inside a block (the fast
  decoder's grouped-query decode step) and restores it.
* ``has_input_require_grads_hook(model)``: ``PreTrainedModel.enable_input_require_grads`` keeps its hook handle as
  ``model._require_grads_hook``; reading it tells whether the hook is already in place (LoRA with gradient
  checkpointing needs it once).
* KV caches (4.56 made them lists of per-layer objects): ``cache_tensors`` reads the ``(keys, values)`` tensors of
  every layer of a filled ``DynamicCache`` or ``StaticCache`` (``Cache.layers``, each with ``keys``/``values``);
  ``select_cache_rows`` keeps chosen batch rows of every layer (``Cache.reorder_cache``, written for beam search);
  ``full_static_cache`` builds a static cache of full-attention layers (a ``Cache`` of ``StaticLayer``), allocated
  now for a given row count, KV head count, head size, dtype and device (``Cache.early_initialization``;
  ``StaticCache(config)`` would size sliding-window layers by the config's window, and allocates on the first write),
  casting what it stores to that dtype (4.57's ``StaticLayer.update`` does not; 4.48's ``StaticCache`` did).
* Calling one decoder layer directly (the fast decode step, grouped scoring): ``run_decoder_layer`` passes the cache
  under the layers' keyword ``past_key_values`` (named ``past_key_value`` before 4.56), returns the hidden states they
  return (a tensor since 4.56; a tuple before), and calls the module without transformers' per-layer checkpointing
  wrapper (``GradientCheckpointingLayer.__call__``, which in train mode with gradient checkpointing drops the cache
  and checkpoints the layer on its own), because the grouped scorer passes its own key/value store and checkpoints
  the layer pair itself.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn
from transformers import PretrainedConfig
from transformers.cache_utils import Cache, StaticLayer

ATTENTION_IMPLEMENTATION_ATTRIBUTE = "_attn_implementation"  # PretrainedConfig: the kernel the layers dispatch on
REQUIRE_GRADS_HOOK_ATTRIBUTE = "_require_grads_hook"  # PreTrainedModel.enable_input_require_grads: its hook handle
LAYER_CACHE_KEYWORD = "past_key_values"  # the decoder layers' keyword for the KV cache (past_key_value before 4.56)


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


def cache_tensors(cache: Cache) -> list[tuple[Tensor, Tensor]]:
    """``(keys, values)`` of every layer, each ``[B, Hkv, S, hd]``: the cache's own storage (writes go into it)."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def select_cache_rows(cache: Cache, rows: Tensor) -> None:
    """Replace every layer's keys/values by their batch rows ``rows`` (``[n]`` long, repeats allowed), in place."""
    cache.reorder_cache(rows)


class _CastingStaticLayer(StaticLayer):
    """A ``StaticLayer`` that casts what it stores to its own dtype: under autocast the keys leave RoPE in float32
    while the values stay in the autocast dtype (transformers 4.57 stores without a cast and fails on the mismatch)."""

    def update(self, key_states: Tensor, value_states: Tensor, cache_kwargs=None) -> tuple[Tensor, Tensor]:
        return super().update(key_states.to(self.keys.dtype), value_states.to(self.values.dtype), cache_kwargs)


def full_static_cache(num_layers: int, rows: int, slots: int, like: Tensor) -> Cache:
    """A static cache of ``num_layers`` full-attention layers of ``[rows, Hkv, slots, hd]`` zeros, where
    ``like [., Hkv, ., hd]`` gives the KV heads, head size, dtype and device; allocated now (fixed addresses). What
    is written to it is cast to that dtype."""
    cache = Cache(layers=[_CastingStaticLayer(max_cache_len=slots) for _ in range(num_layers)])
    cache.early_initialization(rows, like.shape[1], like.shape[3], like.dtype, like.device)
    return cache


def run_decoder_layer(layer: nn.Module, hidden: Tensor, cache, **kwargs) -> Tensor:
    """``layer(hidden, cache, **kwargs)`` → the layer's output hidden states, with ``cache`` (a ``Cache`` or any object
    with its ``update(key, value, layer_idx, cache_kwargs)``) used as given, in train mode too. Layers that still
    return a tuple (Qwen2.5-VL's, in 4.57) give its first item, the hidden states."""
    out = nn.Module.__call__(layer, hidden, **{LAYER_CACHE_KEYWORD: cache}, **kwargs)
    return out[0] if isinstance(out, tuple) else out
