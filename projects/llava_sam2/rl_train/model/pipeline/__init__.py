"""The model pipeline every caller runs: images encoded once, prompts embedded, answers and their masks.

* ``shared``: ``encode_images``, ``prompt_embeds``, ``greedy_answers``, ``forced_seg_prompts`` (the GRPO loops,
  the evaluation, ``predict`` and the prompt-selection line all call these);
* ``inference``: ``predict`` / ``predict_batch`` with upstream ``predict_forward`` semantics;
* ``video``: ``predict_video`` with upstream ``predict_forward(video=...)`` semantics (5 MLLM frames, SAM2 memory
  propagation over every frame → one masklet per ``[SEG]``), built on ``shared``;
* ``region_chain``: the released mask chain evaluated at the region sample points (the ``region`` mask action).

Imports: ``text``, ``network`` and ``decoding`` (the top of ``model/``).
"""
