"""Loop 1's drawn region input against the InternVL family's native region tokens, on the shapes world.

From the committed ``assets/tiny_shapes_pretrained``, two continuations of the joint stage with the same steps,
learning rate, seed and data stream (``pretrain_tiny --sam-steps 0 --lm-steps 0 --joint-steps N``), run side by
side on one device:

* arm A, ``--region-input native``: caption rows show their region as region tokens (the control: as much extra
  training as arm B, so B − A is the input's effect, not the extra steps');
* arm B, ``--region-input drawn``: caption rows show the region drawn into a copy of the scene (white outline, no
  region tokens), asked "... the region outlined in white.".

Then, on the same held-out scenes (``ShapesWorld('test', seed=--eval-seed)`` at 128 px, never trained on), caption
METEOR (nltk) and cycle IoU (region → the model's caption → its own RES → IoU with the region), each row with its
region input: the committed model native and drawn (the drawn row is zero-shot: it never saw an outline), arm A native,
arm B drawn; paired bootstrap CIs (evaluation/bootstrap.py, scene-level) of B − A and of zero-shot − committed native.
Writes ``OUT/drawn_region_measure.json`` (settings, per-arm training logs, every row's metrics, the per-scene scores,
the differences) and ``OUT/drawn_region_measure.md`` (the table). Needs WordNet for METEOR (``NLTK_DATA``).

    python -m research.drawn_region_measure --out runs/drawn_region --device cuda --joint-steps 600 \\
        --scenes-per-batch 32 --eval-scenes 300 --num-workers 4
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.demo.pretrain_tiny import build_tiny
from projects.llava_sam2.rl_train.evaluation.bootstrap import bootstrap_mean, paired_difference
from projects.llava_sam2.rl_train.evaluation.tasks import EvalConfig, evaluate

COMMITTED = "projects/llava_sam2/rl_train/assets/tiny_shapes_pretrained"
TASKS = ("caption", "cycle_iou")
METRIC_NAMES = {"caption": "caption METEOR", "cycle_iou": "cycle IoU"}
ARMS = {"A": "native", "B": "drawn"}


def continuation_command(args, arm: str, out: Path) -> list[str]:
    """The ``pretrain_tiny`` run of one arm: joint stage only, every knob but the region input shared."""
    return [sys.executable, "-m", "projects.llava_sam2.rl_train.demo.pretrain_tiny", "--out", str(out),
            "--init", args.init, "--seed", str(args.seed), "--device", args.device, "--threads", "1",
            "--num-workers", str(args.num_workers), "--scenes-per-batch", str(args.scenes_per_batch),
            "--sam-steps", "0", "--lm-steps", "0", "--joint-steps", str(args.joint_steps),
            "--joint-lr", str(args.joint_lr), "--warmup-steps", str(args.warmup_steps), "--teacher-weight", "0",
            "--log-every", str(max(1, args.joint_steps // 8)), "--eval-scenes", "0",
            "--region-input", ARMS[arm]]


def train_arms(args, out: Path) -> dict:
    """Both continuations at once (two processes on one device); their logs and commands."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    runs = {}
    start = time.perf_counter()
    for arm in ARMS:
        command = continuation_command(args, arm, out / f"arm_{arm}")
        log = open(out / f"arm_{arm}.log", "w")
        runs[arm] = (command, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log)
    failed = []
    for arm, (_, process, log) in runs.items():
        if process.wait() != 0:
            failed.append(arm)
        log.close()
    if failed:
        raise SystemExit(f"drawn_region_measure: arm(s) {failed} failed; see {out}/arm_<arm>.log")
    return read_arms(out, round(time.perf_counter() - start, 1))


def read_arms(out: Path, wall_seconds: float | None) -> dict:
    """Each arm's training as its own ``pretrain_log.json`` tells it."""
    logs = {}
    for arm in ARMS:
        log = json.loads((out / f"arm_{arm}" / "pretrain_log.json").read_text())
        joint = next(stage for stage in log["stages"] if stage["name"] == "joint")
        logs[arm] = {"region_input": log["settings"]["region_input"], "command": log["command"],
                     "steps_done": joint["steps_done"], "train_seconds": log["train_seconds"],
                     "last_row": joint["rows"][-1] if joint["rows"] else None, "sha256": log["sha256"],
                     **{k: log["settings"][k] for k in ("seed", "scenes_per_batch", "joint_lr", "init")}}
        if logs[arm]["region_input"] != ARMS[arm]:
            raise ValueError(f"{out}/arm_{arm} was trained with region_input={logs[arm]['region_input']!r}")
    return {"wall_seconds": wall_seconds, "arms": logs}


def evaluate_row(checkpoint: str, region_input: str, args) -> dict:
    """Caption METEOR and cycle IoU of one checkpoint with one region input on the held-out scenes."""
    model, _, processor = build_tiny(args.seed, args.device, checkpoint)
    model.eval()
    world = ShapesWorld("test", args.eval_scenes, args.eval_seed, image_size=args.eval_image_size)
    config = EvalConfig(batch_size=args.eval_batch_size, show_progress=False, keep_masks=False,
                        region_input=region_input, n_resamples=args.n_resamples, seed=0)
    start = time.perf_counter()
    results = evaluate(model, processor, world, TASKS, config)
    row = {"checkpoint": checkpoint, "region_input": region_input, "seconds": round(time.perf_counter() - start, 1),
           "scores": {task: [r.score for r in results[task].records] for task in TASKS},
           "sample_ids": [r.sample_id for r in results[TASKS[0]].records],
           "metrics": {task: {k: v.to_dict() for k, v in results[task].metrics.items()} for task in TASKS},
           "example_captions": [r.caption for r in results["caption"].records[:5]]}
    del model
    if torch.device(args.device).type == "cuda":
        torch.cuda.empty_cache()
    return row


def differences(rows: dict, first: str, second: str, n_resamples: int) -> dict:
    """Paired bootstrap CI of row ``first`` − row ``second``, per task, over the same scenes."""
    if rows[first]["sample_ids"] != rows[second]["sample_ids"]:
        raise ValueError(f"rows {first} and {second} were scored on different scenes")
    return {task: paired_difference(rows[first]["scores"][task], rows[second]["scores"][task],
                                    n_resamples=n_resamples, seed=0).to_dict() for task in TASKS}


def markdown(report: dict) -> str:
    def cell(estimate: dict, signed: bool = False) -> str:
        sign = "+" if signed else ""
        return f"{estimate['value']:{sign}.3f} [{estimate['low']:{sign}.3f}, {estimate['high']:{sign}.3f}]"

    s, arm = report["settings"], report["training"]["arms"]["A"]  # the arms' own logs, as trained
    steps = "/".join(str(report["training"]["arms"][a]["steps_done"]) for a in ARMS)
    lines = [f"Held-out: `ShapesWorld('test', seed={s['eval_seed']})`, {s['eval_scenes']} scenes at "
             f"{s['eval_image_size']} px; arms A/B {steps} joint steps of {arm['scenes_per_batch']} scenes "
             f"(lr {arm['joint_lr']}, seed {arm['seed']}) from `{arm['init']}`; 95 % bootstrap CIs "
             f"({s['n_resamples']} resamples). Device: {report['device']}.", "",
             "| model | region input | " + " | ".join(METRIC_NAMES[t] for t in TASKS) + " |",
             "|---|---|" + "---|" * len(TASKS)]
    for name, row in report["rows"].items():
        means = [cell(bootstrap_mean(row["scores"][t], n_resamples=s["n_resamples"], seed=0).to_dict())
                 for t in TASKS]
        lines.append(f"| {name} | {row['region_input']} | " + " | ".join(means) + " |")
    for name, diff in report["differences"].items():
        lines.append(f"| **{name}** (paired) | | " + " | ".join(cell(diff[t], True) for t in TASKS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--init", default=COMMITTED, help="the checkpoint both arms continue (and the zero-shot row)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--joint-steps", type=int, default=600)
    parser.add_argument("--scenes-per-batch", type=int, default=32)
    parser.add_argument("--joint-lr", type=float, default=4e-4)
    parser.add_argument("--warmup-steps", type=int, default=40)
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument("--eval-scenes", type=int, default=300)
    parser.add_argument("--eval-seed", type=int, default=0)
    parser.add_argument("--eval-image-size", type=int, default=128)
    parser.add_argument("--eval-batch-size", type=int, default=64)
    parser.add_argument("--n-resamples", type=int, default=1000)
    parser.add_argument("--reuse-arms", action="store_true",
                        help="evaluate the arms already trained under OUT (arm_A, arm_B) instead of training them")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    training = read_arms(out, None) if args.reuse_arms else train_arms(args, out)
    print(json.dumps({"trained": training}), flush=True)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    plan = {"committed": (args.init, "native"), "committed, zero-shot drawn": (args.init, "drawn"),
            "A: + native steps": (str(out / "arm_A"), "native"), "B: + drawn steps": (str(out / "arm_B"), "drawn")}
    rows = {}
    for name, (checkpoint, region_input) in plan.items():
        rows[name] = evaluate_row(checkpoint, region_input, args)
        print(json.dumps({"evaluated": name, "seconds": rows[name]["seconds"],
                          **{t: rows[name]["metrics"][t] for t in TASKS}}), flush=True)
    device = torch.cuda.get_device_name(torch.device(args.device)) if torch.device(args.device).type == "cuda" \
        else "cpu"
    report = {"command": "python -m research.drawn_region_measure " + " ".join(argv or sys.argv[1:]),
              "settings": vars(args), "device": device, "training": training, "rows": rows,
              "differences": {"B − A (drawn − native, equal extra training)": differences(
                                  rows, "B: + drawn steps", "A: + native steps", args.n_resamples),
                              "zero-shot drawn − committed native": differences(
                                  rows, "committed, zero-shot drawn", "committed", args.n_resamples)}}
    report["wall_seconds"] = round(time.perf_counter() - start, 1)
    (out / "drawn_region_measure.json").write_text(json.dumps(report, indent=1))
    (out / "drawn_region_measure.md").write_text(markdown(report))
    print(markdown(report), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
