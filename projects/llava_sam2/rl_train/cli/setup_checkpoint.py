"""Write a tiny random Sa2VA checkpoint in the upstream HF layout, with the tiny tokenizer.

    sa2va-rl setup tiny-checkpoint OUT_DIR [--seed 0] [--dtype float32|bfloat16|float16]

OUT_DIR gets config.json, model.safetensors and the tokenizer files; it loads with
``load_pretrained(OUT_DIR)`` and ``AutoTokenizer.from_pretrained(OUT_DIR)``. The same seed
gives bit-identical weights.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from projects.llava_sam2.rl_train.model.checkpoints.dtypes import DTYPES, as_torch_dtype
from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import save_pretrained
from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

PROG = "sa2va-rl setup tiny-checkpoint"


def make_tiny_checkpoint(out_dir: str | Path, seed: int = 0, dtype: str | torch.dtype = torch.float32) -> Path:
    """Build the ``tiny`` preset with the tiny tokenizer's vocabulary, seeded, and save both."""
    out = Path(out_dir)
    dtype = as_torch_dtype(dtype, "dtype")
    tokenizer = load_tiny_tokenizer()
    config = build_preset("tiny", vocab_size=len(tokenizer))
    if dtype != torch.float32:
        config.extra["torch_dtype"] = str(dtype).removeprefix("torch.")
    torch.manual_seed(seed)
    model = Sa2VAModel(config).to(dtype)
    model.bind_tokenizer(tokenizer)  # checks the vocabulary fits
    save_pretrained(model, out)
    tokenizer.save_pretrained(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="directory to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="torch seed for the random weights")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="weight dtype")
    args = parser.parse_args(argv)
    out = make_tiny_checkpoint(args.out_dir, seed=args.seed, dtype=args.dtype)
    print(f"wrote tiny Sa2VA checkpoint to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
