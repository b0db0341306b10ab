"""Regenerate the shipped tiny tokenizer (projects/llava_sam2/rl_train/assets/tiny_tokenizer).

    sa2va-rl setup tiny-tokenizer [--out DIR] [--check]      # or: python tools/setup/build_tiny_tokenizer.py

The build is deterministic: running it again rewrites the same bytes. ``--check`` builds into a
temporary folder and exits 1 if any file differs from the shipped copy.
"""
from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from projects.llava_sam2.rl_train.model.text.tokenizer import TINY_TOKENIZER_DIR, save_tiny_tokenizer

PROG = "sa2va-rl setup tiny-tokenizer"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TINY_TOKENIZER_DIR, help="output folder")
    parser.add_argument("--check", action="store_true",
                        help="compare a fresh build with --out instead of writing it")
    args = parser.parse_args(argv)
    if not args.check:
        for path in save_tiny_tokenizer(args.out):
            print(f"wrote {path}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = save_tiny_tokenizer(tmp)
        differing = [p.name for p in fresh if not filecmp.cmp(p, args.out / p.name, shallow=False)]
    if differing:
        print(f"tiny tokenizer differs from {args.out}: {differing}; rerun without --check")
        return 1
    print(f"tiny tokenizer in {args.out} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
