#!/usr/bin/env python
"""Set-up script for the Makefile: ``sa2va-rl setup wordnet`` without the console script.

Documented in projects/llava_sam2/rl_train/cli/setup_wordnet.py. Needs the package importable (``pip install -e .``).
"""
import sys

from projects.llava_sam2.rl_train.cli.setup_wordnet import main

if __name__ == "__main__":
    sys.exit(main())
