"""Experiment (docs/demo.md, "The CI test"): the noise margins of tests/test_demo_pipeline.py.

Runs the test's shortened demo (``short_demo``: data -> GRPO from the pretrained tiny Sa2VA -> export) for several
seeds, once as the test runs it and once at learning rate 0 (the null: the policy and the EMA partner stay the
pretrained model, so a change of the training reward between the first and the last WINDOW iterations is sampling
noise only). Prints each run's rise per loop and, per loop, the largest null rise, the smallest learning rise and
their gap; writes everything to OUT/margins.json.

    OMP_NUM_THREADS=1 python -m tools.experiments.demo_test_margins --out work_dirs/test_margins --seeds 0 1 2 3 4
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from projects.llava_sam2.rl_train.demo.summary import REWARD_KEYS, reward_trend
from tests.test_demo_pipeline import WINDOW, short_demo

NULL = ["optim_wrapper.optimizer.lr=0.0"]


def rises(work_dir: Path, seed: int, options: list[str]) -> dict[str, float]:
    settings, _ = short_demo(work_dir, seed=seed, options=options)
    trend = reward_trend(settings.path("rl"), window=WINDOW)
    return {key: trend[key]["last"] - trend[key]["first"] for key in REWARD_KEYS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="work_dirs/test_margins")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args()
    out = Path(args.out).resolve()
    runs = {kind: {seed: rises(out / f"{kind}_seed{seed}", seed, options) for seed in args.seeds}
            for kind, options in (("learn", []), ("null", NULL))}
    summary = {}
    for key in REWARD_KEYS:
        learn = [r[key] for r in runs["learn"].values()]
        null = [r[key] for r in runs["null"].values()]
        summary[key] = {"learn": learn, "null": null, "min_learn": min(learn), "max_null": max(null),
                        "null_std": statistics.stdev(null) if len(null) > 1 else float("nan"),
                        "learn_mean": statistics.mean(learn)}
        print(f"{key}: learning rises {', '.join(f'{v:+.4f}' for v in learn)}; null rises "
              f"{', '.join(f'{v:+.4f}' for v in null)} (std {summary[key]['null_std']:.4f}); "
              f"max null {max(null):+.4f} < min learning {min(learn):+.4f}: {max(null) < min(learn)}")
    (out / "margins.json").write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
