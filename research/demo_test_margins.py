"""Experiment (docs/demo.md, "The CI test"): the noise margins of tests/test_demo_pipeline.py.

Runs the test's shortened demo (``short_demo``: data -> ``sa2va-rl train`` of the GRPO config from the pretrained tiny
Sa2VA -> export) for several seeds, once as the test runs it (``learn``) and once at learning rate 0 (``null``: the
policy and the EMA partner stay the pretrained model, so a change of the training reward between the first and the
last WINDOW iterations is sampling noise only). Prints each run's rise per loop (REWARD_KEYS) and wall time, and per
loop the largest null rise, the smallest learning rise and whether they separate; writes OUT/margins.json after every
run (an interrupted calibration keeps what it measured; finished runs are read back, not redone).

    OMP_NUM_THREADS=1 python -m research.demo_test_margins --out work_dirs/test_margins --seeds 0 1 2

``--options`` adds --cfg-options to both kinds and ``--rl-iters`` changes the run length, to try other settings
(use another ``--out``); ``--domain`` runs the domain demo's data and config (unpaired target scenes).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from projects.llava_sam2.rl_train.demo.summary import REWARD_KEYS, reward_trend
from tests.demo_short import DOMAIN_DATA, RL_ITERS, WINDOW, short_demo

KINDS = {"learn": [], "null": ["optim_wrapper.optimizer.lr=0.0"]}


def one_run(work_dir: Path, seed: int, options: list[str], rl_iters: int, data: dict | None = None) -> dict:
    """The rise (last WINDOW − first WINDOW mean training reward) per loop of one shortened run, and its wall time."""
    start = time.perf_counter()
    settings, _ = short_demo(work_dir, seed=seed, options=options, rl_iters=rl_iters, data=data)
    trend = reward_trend(settings.path("rl"), window=WINDOW)
    return {"wall_s": round(time.perf_counter() - start, 1),
            **{key: trend[key]["last"] - trend[key]["first"] for key in REWARD_KEYS},
            "trend": trend}


def summarize(runs: dict) -> dict:
    summary = {}
    for key in REWARD_KEYS:
        learn = [r[key] for r in runs.get("learn", {}).values()]
        null = [r[key] for r in runs.get("null", {}).values()]
        if not learn or not null:
            continue
        summary[key] = {"learn": learn, "null": null, "min_learn": min(learn), "max_null": max(null),
                        "separated": max(null) < min(learn), "midpoint": (max(null) + min(learn)) / 2,
                        "null_std": statistics.stdev(null) if len(null) > 1 else float("nan")}
        print(f"{key}: learning rises {', '.join(f'{v:+.4f}' for v in learn)}; null rises "
              f"{', '.join(f'{v:+.4f}' for v in null)}; max null {max(null):+.4f} < min learning "
              f"{min(learn):+.4f}: {max(null) < min(learn)}")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="work_dirs/test_margins")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--options", nargs="*", default=[], help="extra --cfg-options of both kinds")
    parser.add_argument("--rl-iters", type=int, default=RL_ITERS)
    parser.add_argument("--domain", action="store_true",
                        help="the domain demo's data (unpaired target scenes, its GRPO config) instead of the "
                             "paired same-domain data the test's margins were measured on")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    record = out / "margins.json"
    saved = json.loads(record.read_text()) if record.is_file() else {}
    runs = saved.get("runs", {})
    for seed in args.seeds:  # alternate the kinds so that a cut-short calibration has both
        for kind in args.kinds:
            if str(seed) in runs.get(kind, {}):
                continue
            result = one_run(out / f"{kind}_seed{seed}", seed, [*args.options, *KINDS[kind]], args.rl_iters,
                             DOMAIN_DATA if args.domain else None)
            runs.setdefault(kind, {})[str(seed)] = result
            print(f"{kind} seed {seed}: " + ", ".join(f"{k} {result[k]:+.4f}" for k in REWARD_KEYS)
                  + f" ({result['wall_s']} s)", flush=True)
            record.write_text(json.dumps({"options": args.options, "rl_iters": args.rl_iters, "window": WINDOW,
                                          "runs": runs}, indent=1))
    summary = summarize(runs)
    record.write_text(json.dumps({"options": args.options, "rl_iters": args.rl_iters, "window": WINDOW,
                                  "runs": runs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
