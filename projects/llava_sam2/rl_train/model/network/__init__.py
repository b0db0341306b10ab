"""The Sa2VA network: configuration, InternViT, the language model, the SAM2 grounding head, LoRA, presets.

* ``configuration``: ``Sa2VAConfig`` (the upstream ``config.json``, unknown keys kept);
* ``vision``: InternViT tiles, pixel shuffle and the ``mlp1`` projector;
* ``language``: the LLM built from ``llm_config`` with transformers classes (InternLM2 as Llama, key map);
* ``grounding``: the SAM2 head from the ``sam2`` package and the logits → mask chain;
* ``sa2va``: ``Sa2VAModel``, the composition callers step through (no checkpoint I/O: see ``checkpoints``);
* ``lora``: LoRA on the LLM and the one definition of the trainable tensors;
* ``presets``: size presets as data (``build_preset``).

Imports: ``text`` only. Reading and writing weights lives one layer up, in ``checkpoints``.
"""
