"""Decoding and teacher-forced scoring of the language model fed with ``inputs_embeds``.

* ``generation``: the reference sampler (``sample_completions``) and teacher-forced log-probs / hidden states;
* ``fast_generation`` + ``fast_decode_step``: the fast decoder (shared-prefix prefill, static KV cache, a
  graph-replayable step) and ``decode_completions``, the one switch between the decoders;
* ``adapter_merge``: decoding from merged scratch copies of the LoRA weights;
* ``grouped_scoring``: the GRPO loss pass, each prompt run once for its group of completions;
* ``text_decoding``: stop words, ``sample_text`` and token ids ↔ answer text.

Imports: ``text`` and ``network``.
"""
