"""Markdown report + PNGs comparing evaluation runs of the same held-out split (systems and controls).

    sa2va-rl report --run base=work_dirs/eval/base --run rl=work_dirs/eval/rl \\
        --baseline base --work-dir work_dirs/demo/train --out work_dirs/demo

Writes ``OUT/report.md``, ``OUT/metrics.png``, ``OUT/curves.png`` (with --work-dir) and
``OUT/examples_<task>.png``. Runs come from ``sa2va-rl evaluate --out``.
"""
from __future__ import annotations

import argparse
import sys

from projects.llava_sam2.rl_train.evaluation.report import write_report

PROG = "sa2va-rl report"


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    """``['name=value', ...]`` → dict, in order; a value without '=' raises naming the flag."""
    out = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise SystemExit(f"{flag} {value!r}: expected NAME=VALUE")
        out[name] = rest
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, metavar="NAME=DIR",
                        help="a system and its `sa2va-rl evaluate --out` directory (repeat; first is the default "
                             "baseline)")
    parser.add_argument("--baseline", help="system the others are compared with (paired bootstrap)")
    parser.add_argument("--out", required=True, help="report directory")
    parser.add_argument("--work-dir", help="training work_dir (or scalars.json) for reward curves")
    parser.add_argument("--curve", action="append", default=[], metavar="TITLE=KEY",
                        help="scalar key to plot (repeat; default mask_to_caption/reward_mean and "
                             "caption_to_mask/reward_mean)")
    parser.add_argument("--smooth", type=int, help="moving-average window in logged points")
    parser.add_argument("--examples", type=int, default=4, help="held-out samples per example figure (0: none)")
    parser.add_argument("--title", default="Sa2VA-RL held-out evaluation")
    parser.add_argument("--n-resamples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = write_report(args.out, _pairs(args.run, "--run"), baseline=args.baseline, scalars=args.work_dir,
                        curves=_pairs(args.curve, "--curve") or None, smooth=args.smooth,
                        num_examples=args.examples, title=args.title, n_resamples=args.n_resamples, seed=args.seed)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
