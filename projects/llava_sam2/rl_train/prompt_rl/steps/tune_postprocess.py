"""Tune a logit threshold and one morphology step on train images of a quality cache; report held-out Dice.

    sa2va-rl prompt-rl postprocess CACHE OUT_DIR [--prompts default,best_fixed]

For each prompt choice (the default prompt; the best fixed prompt chosen by train Dice) the grid
THRESHOLDS x MORPHOLOGY (prompt_rl/postprocess.py) is scored on train images, and the best setting is compared with
the untouched masks on held-out images (paired bootstrap CI). Writes OUT_DIR/postprocess_results.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from projects.llava_sam2.rl_train.prompt_rl.postprocess import tune_postprocess
from projects.llava_sam2.rl_train.prompt_rl.quality_data import load_quality_data
from projects.llava_sam2.rl_train.prompt_rl.selection import best_fixed_prompt

PROG = "sa2va-rl prompt-rl postprocess"

PROMPT_CHOICES = ("default", "best_fixed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("cache", help="quality cache")
    parser.add_argument("out_dir", help="output directory")
    parser.add_argument("--prompts", default="default,best_fixed", help=f"comma list from {PROMPT_CHOICES}")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.prompts.split(",") if n.strip()]
    bad = [n for n in names if n not in PROMPT_CHOICES]
    if not names or bad:
        parser.error(f"--prompts {args.prompts!r}: expected names from {PROMPT_CHOICES}")
    start = time.perf_counter()
    data = load_quality_data(args.cache)
    train, held = data.split_indices("train"), data.split_indices("heldout")
    prompt = {"default": 0, "best_fixed": best_fixed_prompt(data, train)}
    results = {"cache": str(args.cache), "prompt_labels": data.meta["prompt_labels"], "choices": {}}
    for name in names:
        k = prompt[name]
        out = tune_postprocess(data, np.full(len(train), k), np.full(len(held), k), n_resamples=args.bootstrap,
                               seed=args.seed)
        results["choices"][name] = {"prompt_index": k, **out}
        print(json.dumps({name: {"best": out["best"], "heldout_untouched": round(out["heldout"]["untouched"]["value"], 4),
                                 "heldout_tuned": round(out["heldout"]["tuned"]["value"], 4)}}))
    results["seconds"] = round(time.perf_counter() - start, 1)
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.out_dir) / "postprocess_results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
