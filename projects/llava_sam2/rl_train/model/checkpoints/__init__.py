"""Weights in and out: the HF Sa2VA layout, upstream XTuner SFT runs and DeepSpeed ZeRO directories.

* ``hf_checkpoint``: ``load_pretrained`` / ``save_pretrained`` in the HF Sa2VA layout (strict keys, LoRA merged);
* ``hf_config``: the ``config.json`` class fields upstream's HF readers need (v1 and codebase v2);
* ``dtypes``: dtype names ↔ torch dtypes, the one table every caller uses;
* ``xtuner_keys``: upstream training-model key names ↔ HF checkpoint names;
* ``xtuner_checkpoint``: an upstream SFT checkpoint into ``Sa2VAModel`` and back;
* ``upstream_base``: the inputs an upstream SFT run names (base InternVL dir, SAM2 weights, tokenizer);
* ``upstream_convert``: upstream SFT run → HF layout (what upstream's converter writes);
* ``deepspeed_zero``: a ZeRO checkpoint directory read into one state dict without DeepSpeed;
* ``tiny_upstream_run``: a tiny upstream-style SFT run built with our code (tests, README walkthrough).

Imports: ``text`` and ``network`` (checkpoint I/O builds the network; the network never imports this).
"""
