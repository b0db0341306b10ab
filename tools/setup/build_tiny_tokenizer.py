#!/usr/bin/env python
"""Set-up script for the Makefile: ``sa2va-rl setup tiny-tokenizer`` without the console script.

Documented in projects/llava_sam2/rl_train/cli/setup_tokenizer.py. Needs the package importable (``pip install -e .``).
"""
import sys

from projects.llava_sam2.rl_train.cli.setup_tokenizer import main

if __name__ == "__main__":
    sys.exit(main())
