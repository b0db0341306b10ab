"""Report of ``sa2va-rl demo-controls`` (controls.py): the per-seed goal table, the controls against SFT-only, the
caption-drift check and the training-reward curves of the mask policies (``WORK_DIR/report.md`` + PNGs).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from projects.llava_sam2.rl_train.demo.pipeline import SYSTEMS, read_stages
from projects.llava_sam2.rl_train.demo.summary import compare_runs, goal_checks


def _mean_ci(values: list[float]) -> str:
    """mean ± sample std over seeds (no CI from 3 values)."""
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else float("nan")
    return f"{mean:+.3f} ± {std:.3f}"


def seed_table(per_seed: Mapping[int, object]) -> tuple[str, bool]:
    """Markdown rows per seed: cycle IoU of both systems, the paired deltas, the two goal checks; and whether the goal
    holds on every seed."""
    lines = ["| seed | cycle IoU SFT-only | cycle IoU SFT + GRPO | Δ cycle IoU | Δ res gIoU | Δ caption METEOR | "
             "Δ cycle METEOR | cycle gain goal | no regression |", "|" + "---|" * 9]
    deltas: dict[str, list[float]] = {}
    all_pass = True
    for seed, s in per_seed.items():
        rows = {f"{r.task}/{r.metric}": r for r in compare_runs(s.path("eval/sft"), s.path("eval/rl"))}
        checks = goal_checks(list(rows.values()))
        all_pass &= all(c["passed"] for c in checks.values())
        cycle = rows["cycle_iou/cycle_IoU"]
        cells = [str(seed), cycle.base.format(3), cycle.rl.format(3)]
        for key in ("cycle_iou/cycle_IoU", "res/gIoU", "caption/METEOR_nltk", "cycle_caption/cycle_METEOR_nltk"):
            cells.append(rows[key].diff.format(3))
            deltas.setdefault(key, []).append(rows[key].diff.value)
        cells += ["✅" if checks[k]["passed"] else "❌" for k in ("cycle_gain", "no_regression")]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("| mean ± std | | | " + " | ".join(_mean_ci(deltas[k]) for k in deltas) + " | | |")
    return "\n".join(lines), all_pass


def plot_policy_curves(policy_runs: Mapping[str, Path], out: Path) -> str:
    """Loop-1 and loop-2 training reward per mask policy (moving average of 10 iterations), one panel per loop."""
    import numpy as np
    from matplotlib.figure import Figure

    from projects.llava_sam2.rl_train.evaluation.plots import find_scalars, read_scalars

    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    for ax, key in zip(axes, ("mask_to_caption/reward_mean", "caption_to_mask/reward_mean")):
        for policy, work_dir in policy_runs.items():
            rows = [r for r in read_scalars(find_scalars(str(work_dir))) if key in r]
            steps = np.array([r["step"] for r in rows], dtype=float)
            values = np.array([r[key] for r in rows], dtype=float)
            window = min(10, len(values)) or 1
            smooth = np.convolve(values, np.ones(window) / window, mode="valid")
            ax.plot(steps[window - 1:], smooth, label=policy)
        ax.set_title(key)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    return out.name


def write_controls_report(root: Path, runs: Mapping[str, str], per_seed: Mapping[int, object],
                          policy_runs: Mapping[str, Path]) -> Path:
    """``root/report.md``: summary sections on top of the evaluation report of every system (seed 0)."""
    from projects.llava_sam2.rl_train.evaluation.report import write_report

    first = next(iter(per_seed.values()))
    report = Path(write_report(str(root), dict(runs), baseline=SYSTEMS["sft"], scalars=str(first.path("rl")),
                               num_examples=3, title="Sa2VA-RL demo: controls and seeds"))
    table, all_pass = seed_table(per_seed)
    stages = read_stages(first)
    cpu = {name.removeprefix("control_"): rec.get("cpu_s") for name, rec in _control_records(first).items()}
    lines = ["## Goal over seeds", "", table, "",
             f"Goal (cycle IoU ≥ SFT-only + 0.10 with non-overlapping CIs, no regression beyond CI) met on every "
             f"seed: {'yes ✅' if all_pass else 'no ❌'}.", "",
             "## Mask policies: training reward", "", f"![mask policies]({plot_policy_curves(policy_runs, root / 'mask_policies.png')})",
             "", "## CPU seconds", "", "| run | CPU s |", "|---|---|",
             f"| SFT (seed {first.seed}) | {stages['sft']['cpu_s']:.0f} |",
             f"| GRPO (seed {first.seed}) | {stages['rl']['cpu_s']:.0f} |"]
    lines += [f"| control {name} | {value:.0f} |" for name, value in cpu.items()]
    text = report.read_text(encoding="utf-8")
    title, _, rest = text.partition("\n")
    report.write_text(f"{title}\n\n" + "\n".join(lines) + "\n" + rest, encoding="utf-8")
    print(table)
    print(f"\nreport: {report}")
    return report


def _control_records(s) -> dict[str, dict]:
    import json

    return {p.stem: json.loads(p.read_text()) for p in sorted(s.path("stages").glob("control_*.json"))}
