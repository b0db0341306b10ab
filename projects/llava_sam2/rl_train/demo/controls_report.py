"""Report of ``sa2va-rl demo-controls`` (controls.py): the per-seed goal table, loop 1 alone per seed, the controls
against the starting model, the text-dependence changes and the training-reward curves of the mask variants
(``WORK_DIR/report.md`` + PNGs). Every Δ is a paired difference on the same held-out samples (scenes for the text
measure) with its 95 % bootstrap CI.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from projects.llava_sam2.rl_train.demo.pipeline import read_stages
from projects.llava_sam2.rl_train.demo.summary import (REWARD_KEYS, compare_runs, control_label, goal_checks,
                                                     text_dependence_results)

# (row key, column title) of the Δ columns
DELTAS = (("cycle_iou/cycle_IoU", "Δ cycle IoU"), ("res/gIoU", "Δ referring gIoU"), ("res/cIoU", "Δ referring cIoU"),
          ("caption/METEOR_nltk", "Δ caption METEOR vs GT"), ("cycle_caption/cycle_METEOR_nltk", "Δ cycle METEOR"))


def _mean_std(values: list[float]) -> str:
    """mean ± sample std over seeds (no CI from 3 values)."""
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else float("nan")
    return f"{mean:+.3f} ± {std:.3f}"


def compare_systems(base_dir: Path, other_dir: Path) -> tuple[dict, object, dict]:
    """(rows by key, text-dependence change or None, goal checks) of ``other`` against ``base``."""
    rows = {f"{r.task}/{r.metric}": r for r in compare_runs(base_dir, other_dir)}
    _, change = text_dependence_results({"base": base_dir, "other": other_dir}, "base")
    return rows, change, goal_checks(list(rows.values()), change)


def _delta_cells(rows: dict, change) -> list[str]:
    cells = [rows[key].diff.format(3) if key in rows else "—" for key, _ in DELTAS]
    return cells + [change.gap.format(3) if change is not None else "—"]


def seed_table(per_seed: Mapping[int, object]) -> tuple[str, bool]:
    """Markdown rows per seed: cycle IoU of both systems, the paired deltas, the goal checks; and whether the goal
    holds on every seed."""
    head = ["seed", "cycle IoU start", "cycle IoU + GRPO", *(t for _, t in DELTAS), "Δ text gap", "cycle gain beyond CI",
            "no regression", "gap kept"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    deltas: dict[str, list[float]] = {}
    all_pass = True
    for seed, s in per_seed.items():
        rows, change, checks = compare_systems(s.path("eval/base"), s.path("eval/rl"))
        all_pass &= all(c["passed"] for c in checks.values())
        cycle = rows["cycle_iou/cycle_IoU"]
        for key, _ in DELTAS:
            deltas.setdefault(key, []).append(rows[key].diff.value)
        if change is not None:
            deltas.setdefault("gap", []).append(change.gap.value)
        marks = ["✅" if checks[k]["passed"] else "❌" if k in checks else "—"
                 for k in ("cycle_gain", "no_regression", "text_gap")]
        lines.append("| " + " | ".join([str(seed), cycle.base.format(3), cycle.rl.format(3),
                                        *_delta_cells(rows, change), *marks]) + " |")
    lines.append("| mean ± std | | | " + " | ".join(_mean_std(v) for v in deltas.values()) + " | | | |")
    return "\n".join(lines), all_pass


def control_table(base_dir: Path, systems: Mapping[str, Path], cpu: Mapping[str, float]) -> str:
    """One row per system: its paired deltas against the starting model and its CPU seconds."""
    head = ["system", *(t for _, t in DELTAS), "Δ text gap", "CPU s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, path in systems.items():
        rows, change, _ = compare_systems(base_dir, path)
        cost = cpu.get(name)
        lines.append("| " + " | ".join([name, *_delta_cells(rows, change),
                                        "—" if cost is None else f"{cost:.0f}"]) + " |")
    return "\n".join(lines)


def loop1_table(per_seed: Mapping[int, object], controls: Mapping[int, Mapping[str, Path]]) -> str:
    """Loop 1 alone per seed: the caption-driven cycle IoU, caption METEOR vs GT, text gap; positive beyond CI?"""
    head = ["seed", *(t for _, t in DELTAS), "Δ text gap", "cycle gain beyond CI"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for seed, s in per_seed.items():
        path = controls.get(seed, {}).get("loop1_only")
        if path is None:
            continue
        rows, change, _ = compare_systems(s.path("eval/base"), path)
        diff = rows["cycle_iou/cycle_IoU"].diff
        cells = [str(seed), *_delta_cells(rows, change), "✅" if diff.low > 0 else "❌"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_variant_curves(runs: Mapping[str, Path], out: Path) -> str:
    """Loop-1 and loop-2 training reward per GRPO run (moving average of 10 iterations), one panel per loop."""
    import numpy as np
    from matplotlib.figure import Figure

    from projects.llava_sam2.rl_train.evaluation.plots import find_scalars, read_scalars

    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    for ax, key in zip(axes, REWARD_KEYS):
        for name, work_dir in runs.items():
            rows = [r for r in read_scalars(find_scalars(str(work_dir))) if key in r]
            if not rows:
                continue
            steps = np.array([r["step"] for r in rows], dtype=float)
            values = np.array([r[key] for r in rows], dtype=float)
            window = min(10, len(values))
            smooth = np.convolve(values, np.ones(window) / window, mode="valid")
            ax.plot(steps[window - 1:], smooth, label=name)
        ax.set_title(key)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    return out.name


def _control_cpu(s) -> dict[str, float]:
    records = {p.stem.removeprefix("control_"): json.loads(p.read_text())
               for p in sorted(s.path("stages").glob("control_*.json"))}
    return {name: rec["cpu_s"] for name, rec in records.items() if "cpu_s" in rec}


def write_controls_report(root: Path, per_seed: Mapping[int, object], controls: Mapping[int, Mapping[str, Path]],
                          default_variant: str | None) -> Path:
    """``root/report.md``: the summary sections on top of the evaluation report of every system of the first seed."""
    from projects.llava_sam2.rl_train.evaluation.report import write_report

    first = next(iter(per_seed.values()))
    names = first.systems
    systems = {names["rl"]: first.path("eval/rl"),
               **{control_label(n): p for n, p in controls.get(first.seed, {}).items()}}
    runs = {names["base"]: first.path("eval/base"), **systems}
    report = Path(write_report(str(root), {k: str(v) for k, v in runs.items()}, baseline=names["base"],
                               scalars=str(first.path("rl")), num_examples=3,
                               title="Sa2VA-RL demo: controls and seeds"))
    stages, control_cpu = read_stages(first), _control_cpu(first)
    cpu = {names["rl"]: stages["rl"]["cpu_s"], **{control_label(n): c for n, c in control_cpu.items()}}
    table, all_pass = seed_table(per_seed)
    variant_runs = {f"{default_variant or 'config'} (demo)": first.path("rl"),
                    **{n.removeprefix("mask_"): first.path("controls", n) for n in controls.get(first.seed, {})
                       if n.startswith("mask_") or n.startswith("kl_")}}
    lines = ["## Goal over seeds (GRPO against the starting model)", "", table, "",
             f"Goal (cycle IoU ≥ start + 0.10 with the paired CI above 0, no regression of referring IoU / caption "
             f"METEOR vs GT beyond CI, text gap not lower beyond CI) met on every seed: "
             f"{'yes ✅' if all_pass else 'no ❌'}.", "",
             "## Loop 1 alone, per seed", "", loop1_table(per_seed, controls), "",
             f"## Controls (seed {first.seed}), paired Δ against the starting model", "",
             control_table(first.path("eval/base"), systems, cpu), "",
             "## Mask actions and KL: training reward", "",
             f"![variants]({plot_variant_curves(variant_runs, root / 'mask_variants.png')})", "",
             "## CPU seconds (train + export + evaluations of each run)", "", "| run | CPU s |", "|---|---|"]
    lines += [f"| {name} | {value:.0f} |" for name, value in cpu.items()]
    if any("sft_more" in c for c in controls.values()):  # the domain demo's table (demo/acceptance.py)
        from projects.llava_sam2.rl_train.demo.acceptance import acceptance

        table_lines, verdict = acceptance(per_seed, controls)
        lines = ["## Domain adaptation: every system and seed", "", *table_lines, *lines]
        (root / "acceptance.json").write_text(json.dumps(verdict, indent=1), encoding="utf-8")
        print("\n".join(table_lines))
    text = report.read_text(encoding="utf-8")
    title, _, rest = text.partition("\n")
    report.write_text(f"{title}\n\n" + "\n".join(lines) + "\n" + rest, encoding="utf-8")
    print(table)
    print(f"\nreport: {report}")
    return report
