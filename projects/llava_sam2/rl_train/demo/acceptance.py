"""The domain-adaptation table over seeds: every system against the starting model on the same
held-out samples (paired 95 % bootstrap CIs), the share of the oracle's cycle-IoU gain that GRPO recovers, and the
acceptance checks.

Systems per seed (``sa2va-rl demo-controls``): ``start`` (the committed pretrained model), ``rl`` (the demo's GRPO
run), ``sft_more`` (the oracle: paired SFT on target scenes for GRPO's iteration time), ``source_sft`` (the same SFT
on source scenes) and any other control run on that seed.

Checks per seed (all on the held-out split the demo evaluates):

* ``cycle_beyond_ci``: GRPO's paired Δ cycle IoU has its CI above 0;
* ``no_regression``: referring gIoU and caption METEOR vs GT are not lower beyond CI;
* ``text_gap``: the text gap is not lower beyond CI;
* ``above_source_sft``: GRPO's cycle IoU is above source-SFT's (paired difference > 0);

and over seeds ``recovers_half``: mean over seeds of Δ cycle IoU (GRPO) / Δ cycle IoU (oracle) >= 0.5.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from projects.llava_sam2.rl_train.demo.summary import (
    compare_runs, control_label, listener_results, reward_trend, text_dependence_results)

RECOVERY_GOAL = 0.5
COLUMNS = (("cycle_iou/cycle_IoU", "Δ cycle IoU"), ("res/gIoU", "Δ referring gIoU"), ("res/cIoU", "Δ referring cIoU"),
           ("caption/METEOR_nltk", "Δ caption METEOR vs GT"))


def system_deltas(base_dir: Path, other_dir: Path) -> dict:
    """Paired Δ (other − base) of the table's metrics: Estimates by key, plus text gap, identical share, listener."""
    out = {f"{r.task}/{r.metric}": r.diff for r in compare_runs(base_dir, other_dir)}
    out["abs/cycle_IoU"] = next((r.rl for r in compare_runs(base_dir, other_dir) if r.metric == "cycle_IoU"), None)
    _, change = text_dependence_results({"base": base_dir, "other": other_dir}, "base")
    out["text_gap"] = None if change is None else change.gap
    out["identical_share"] = None if change is None else change.identical_share
    _, heard = listener_results({"base": base_dir, "other": other_dir}, "base")
    out["listener"] = heard
    return out


def _cell(estimate, scale: float = 1.0) -> str:
    if estimate is None:
        return "—"
    text = estimate.format(3 if scale == 1 else 1, scale)
    return f"**{text}**" if estimate.low > 0 or estimate.high < 0 else text


def _trend(work_dir: Path) -> str:
    try:
        trend = reward_trend(work_dir)
    except (ValueError, FileNotFoundError, OSError):
        return "—"
    return " / ".join(f"{t['first']:.2f} → {t['last']:.2f}" for t in trend.values())


def delta_table(rows: Mapping[str, dict], runs: Mapping[str, Path | None]) -> list[str]:
    """Markdown: one row per (label -> deltas), the Δ columns, text gap, identical share, listener, reward trend."""
    head = ["system / seed", "cycle IoU", *(t for _, t in COLUMNS), "Δ text gap", "Δ identical pairs (pp)",
            "Δ listener accuracy", "training reward loop 1 / loop 2 (first → last quarter)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, deltas in rows.items():
        work = runs.get(label)
        cells = [label, "—" if deltas.get("abs/cycle_IoU") is None else deltas["abs/cycle_IoU"].format(3),
                 *(_cell(deltas.get(key)) for key, _ in COLUMNS), _cell(deltas.get("text_gap")),
                 _cell(deltas.get("identical_share"), 100), _cell(deltas.get("listener")),
                 "—" if work is None else _trend(work)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def acceptance(per_seed: Mapping[int, object], controls: Mapping[int, Mapping[str, Path]]) -> tuple[list[str], dict]:
    """(markdown lines, verdict) of the issue's acceptance over the seeds that have both the oracle and source-SFT."""
    lines, verdict, recovered = [], {"seeds": {}}, []
    rows, runs = {}, {}
    check_lines = ["| seed | Δ cycle IoU GRPO | Δ cycle IoU oracle | recovered | GRPO − source-SFT cycle IoU | cycle "
                   "beyond CI | no regression | text gap kept | above source-SFT |", "|" + "---|" * 9]
    for seed, s in per_seed.items():
        base = s.path("eval/base")
        rl = system_deltas(base, s.path("eval/rl"))
        rows[f"GRPO, seed {seed}"], runs[f"GRPO, seed {seed}"] = rl, s.path("rl")
        for name, path in controls.get(seed, {}).items():
            label = f"{control_label(name)}, seed {seed}"
            rows[label] = system_deltas(base, path)
            runs[label] = s.path("controls", name) if not name.endswith("sft") and name != "sft_more" else None
        oracle, source = controls.get(seed, {}).get("sft_more"), controls.get(seed, {}).get("source_sft")
        if oracle is None or source is None:
            continue
        gain, oracle_gain = rl["cycle_iou/cycle_IoU"], rows[f"{control_label('sft_more')}, seed {seed}"][
            "cycle_iou/cycle_IoU"]
        versus = next(r.diff for r in compare_runs(source, s.path("eval/rl")) if r.metric == "cycle_IoU")
        share = gain.value / oracle_gain.value if oracle_gain.value > 0 else float("nan")
        recovered.append(share)
        checks = {"cycle_beyond_ci": gain.low > 0,
                  "no_regression": not any(rl.get(k) is not None and rl[k].high < 0
                                           for k in ("res/gIoU", "caption/METEOR_nltk")),
                  "text_gap": rl["text_gap"] is None or not rl["text_gap"].high < 0,
                  "above_source_sft": versus.value > 0}
        verdict["seeds"][seed] = {"recovered": share, **checks}
        marks = ["✅" if checks[k] else "❌" for k in checks]
        check_lines.append(f"| {seed} | {_cell(gain)} | {_cell(oracle_gain)} | {share:.0%} | {_cell(versus)} | "
                           + " | ".join(marks) + " |")
    lines += ["### Every system against the starting model (paired Δ, 95 % CIs; bold: beyond CI)", "",
              *delta_table(rows, runs), ""]
    if recovered:
        mean = sum(recovered) / len(recovered)
        verdict["mean_recovered"] = mean
        verdict["met"] = mean >= RECOVERY_GOAL and all(all(v for k, v in seed.items() if k != "recovered")
                                                       for seed in verdict["seeds"].values())
        lines += ["### Acceptance (domain adaptation)", "", *check_lines, "",
                  f"Mean share of the oracle's cycle-IoU gain recovered by GRPO: {mean:.0%} (goal ≥ "
                  f"{RECOVERY_GOAL:.0%}); every check on every seed and the mean: "
                  f"{'met ✅' if verdict['met'] else 'not met ❌'}.", ""]
    return lines, verdict
