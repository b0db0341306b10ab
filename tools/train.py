#!/usr/bin/env python
"""Train a Sa2VA-RL (or SFT) config: ``python tools/train.py CONFIG [xtuner train args]``.

The launcher the Sa2VA workflow expects (``tools/dist_train.sh`` runs it under torchrun); the command itself is
``sa2va-rl train`` (``projects/llava_sam2/rl_train/cli/train.py`` documents the arguments). This file only makes
sure it runs in the right interpreter: one without the training stack (e.g. the system ``python`` when the venv is
not activated), or without this package installed (``pip install -e .``, which ``make setup`` runs) or on
``PYTHONPATH`` (``dist_train.sh`` puts the checkout there), stops with exit code 2 and a message naming the
interpreter, instead of a bare ImportError.
"""
from __future__ import annotations

import importlib.util
import sys

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
    try:
        from projects.llava_sam2.rl_train.cli.train import main as train
    except ModuleNotFoundError as error:
        if not "projects.llava_sam2.rl_train".startswith(error.name or "?"):
            raise
        print(f"tools/train.py: {sys.executable} cannot import projects.llava_sam2.rl_train: install this checkout "
              "into it (`pip install -e .`; `make setup` does) or put the checkout on PYTHONPATH.", file=sys.stderr)
        return 2
    return train(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
