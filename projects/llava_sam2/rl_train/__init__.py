"""Sa2VA-RL: GRPO post-training for Sa2VA (InternVL + SAM2), as an XTuner/MMEngine plugin.

Layers (dependencies point downward only)::

    cli/, demo/, benchmarks/  (the ``sa2va-rl`` commands; cli/main.py lists them)
      -> engine/ -> grpo/ -> model/, rewards/, data/
         evaluation/, prompt_rl/ (optional line) -> model/, rewards/, data/

``projects`` and ``projects/llava_sam2`` are PEP 420 namespace packages (no ``__init__.py``),
so this package merges into an upstream Sa2VA checkout.
"""

__version__ = "0.1.0"
