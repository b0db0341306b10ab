"""End of every side-by-side pretraining call (research/pretrain_*.sh): bring back each run's log and
weights and print one line per run.

    python3 -m research.pretrain_summary --out "$OUT" NAME ...

For each NAME: ``runs/NAME/pretrain_log.json`` is copied to ``logs/NAME.json``; ``logs/`` (with the runs' stdout)
goes to ``OUT/logs.tgz`` and ``runs/NAME`` without its log to ``OUT/ckpt_NAME.tar``. Then, per log: the steps done
of each stage, training seconds, the held-out text dependence and task metrics of the run's own final evaluation.
A run that died before writing its log is named and skipped.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tarfile
from pathlib import Path


def summary_line(log: dict) -> str:
    held_out = log.get("held_out") or {}
    text = {k: round(v["value"], 3) for k, v in held_out.get("text_dependence", {}).items() if isinstance(v, dict)}
    tasks = {t: {k: round(v["value"], 3) for k, v in m.items()} for t, m in held_out.get("tasks", {}).items()}
    stages = " ".join(f"{s['name']}:{s['steps_done']}/{s['planned_steps']}" for s in log["stages"])
    return f"{stages} train_s {log['train_seconds']} wall_s {log.get('wall_seconds')} {text} {tasks}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory whose files come back from the device call")
    parser.add_argument("--runs", default="runs")
    parser.add_argument("--logs", default="logs")
    parser.add_argument("names", nargs="+", help="the runs' names (their --out under --runs)")
    args = parser.parse_args(argv)
    runs, logs, out = Path(args.runs), Path(args.logs), Path(args.out)
    logs.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        if (runs / name / "pretrain_log.json").is_file():
            shutil.copy(runs / name / "pretrain_log.json", logs / f"{name}.json")
    with tarfile.open(out / "logs.tgz", "w:gz") as tar:
        tar.add(logs, arcname=logs.name)
    for name in args.names:
        if (runs / name).is_dir():
            with tarfile.open(out / f"ckpt_{name}.tar", "w") as tar:
                tar.add(runs / name, arcname=name,
                        filter=lambda info: None if info.name.endswith("/pretrain_log.json") else info)
    for name in args.names:
        path = logs / f"{name}.json"
        print(f"{path} {summary_line(json.loads(path.read_text()))}" if path.is_file()
              else f"{name}: no pretrain_log.json (the run did not finish; see {logs / name}.log)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
