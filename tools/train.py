#!/usr/bin/env python
"""Train a Sa2VA-RL (or SFT) config with XTuner's trainer: ``python tools/train.py CONFIG [xtuner train args]``.

Same arguments as ``xtuner train`` (``--work-dir``, ``--deepspeed``, ``--resume``, ``--seed``, ``--cfg-options``,
``--launcher``), with three differences that matter for scripts and CI:

* XTuner's ``tools/train.py`` ``main()`` runs in this process, so a failed run exits non-zero (the ``xtuner train``
  CLI runs it in a child process and ignores the child's exit code; environment.md fact 10).
* ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` is set unless already set: MMEngine and XTuner ``torch.load`` our own
  checkpoints (optimizer state, RNG state, EMA partner), which torch >= 2.6 refuses in weights-only mode (fact 18).
* Without CUDA, the CPU fixes of ``engine/compat.py`` are applied first (gloo DDP, DeepSpeed on CPU; fact 15), and
  a CPU run uses one intra-op thread per process unless ``OMP_NUM_THREADS`` is set.
* An interpreter without the training stack (e.g. the system ``python`` when the venv is not activated) stops with
  exit code 2 and a message naming the interpreter, instead of a bare ImportError.

Multi-process: ``tools/dist_train.sh CONFIG NGPUS [args]`` runs this file under torchrun.
"""
from __future__ import annotations

import importlib.util
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STACK = ("torch", "mmengine", "xtuner")


def missing_stack() -> str | None:
    """None if this interpreter has the training stack, else what to do about it."""
    missing = [name for name in STACK if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (f"{sys.executable} cannot import {missing}: it is not the project's interpreter. Run "
            ".venv/bin/python tools/train.py CONFIG (or `source .venv/bin/activate` first). The same happens silently "
            "with `.venv/bin/xtuner train` in a shell without the venv activated: xtuner's CLI starts its child with "
            "the bare `python` from PATH and exits 0 even when that child fails.")


def main(argv: list[str]) -> int:
    problem = missing_stack()
    if problem:
        print(f"tools/train.py: {problem}", file=sys.stderr)
        return 2
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    if REPO_ROOT not in sys.path:  # the plugin imports as `projects.llava_sam2.rl_train` without pip install -e
        sys.path.insert(0, REPO_ROOT)
    from projects.llava_sam2.rl_train.engine.compat import apply_cpu_compat

    apply_cpu_compat()
    from xtuner.tools import train as xtuner_train

    sys.argv = [xtuner_train.__file__, *argv]  # xtuner parses sys.argv
    xtuner_train.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
