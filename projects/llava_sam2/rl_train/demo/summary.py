"""The demo's verdict: headline held-out metrics of the RL result against the model it starts from, the per-seed
checks, the training reward trends, and the summary on top of ``report.md`` and in the terminal.

Checks of one seed, against the model GRPO starts from ("base"):

* ``cycle_gain``: the paired difference of Loop-1 cycle IoU (RL − base) has its 95% CI above 0. How much of the
  reachable gain that is needs the oracle (paired target SFT for the same compute): ``sa2va-rl demo-controls
  --controls sft_more source_sft`` and its acceptance table (``demo/acceptance.py``; goal: >= 50 % on average);
* ``no_regression``: supervised referring IoU (gIoU, cIoU) and caption METEOR vs the ground truth are not lower
  than the base beyond the CI (the paired difference's CI does not lie entirely below 0);
* ``text_gap``: the segmenter's own-minus-other-text IoU gap (evaluation/text_dependence.py) does not shrink beyond
  its paired CI.

Everything is computed from the evaluation records on disk (``sa2va-rl evaluate`` output, ``text_dependence.json``)
and from the RL run's ``scalars.json``; nothing is special-cased.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# (task, metric, label, counts for the no-regression check)
HEADLINES = (
    ("cycle_iou", "cycle_IoU", "Loop-1 cycle IoU (mask → caption → mask')", False),
    ("cycle_caption", "cycle_METEOR_nltk", "Loop-2 cycle METEOR (caption → mask → caption')", False),
    ("res", "gIoU", "referring IoU vs GT, gIoU (partner-free)", True),
    ("res", "cIoU", "referring IoU vs GT, cIoU (partner-free)", True),
    ("caption", "METEOR_nltk", "caption METEOR vs GT (partner-free)", True),
)
REWARD_KEYS = ("mask_to_caption/reward_mean", "caption_to_mask/reward_mean")
# each loop's training reward and the held-out headline metric that measures the same cycle
REWARD_METRICS = {"mask_to_caption/reward_mean": "cycle_IoU", "caption_to_mask/reward_mean": "cycle_METEOR_nltk"}
# the controls of `sa2va-rl demo-controls` (demo/controls.py) by the name their runs and reports use
KL_BETA = 0.04  # the KL weight of the kl_on control when the config has none (GRPOConfig's default, DeepSeekMath's)
LABELS = {"sft_more": "oracle: paired SFT on the training scenes (GRPO's iteration time)",
          "source_sft": "paired SFT on source scenes (GRPO's iteration time)", "loop1_only": "GRPO loop 1 only",
          "loop2_only": "GRPO loop 2 only", "kl_on": f"GRPO with KL (beta {KL_BETA})", "kl_off": "GRPO without KL"}
TEXT_DEPENDENCE_FILE = "text_dependence.json"
LISTENER_FILE = "listener.json"


def control_label(name: str) -> str:
    """How reports name a control run (a ``mask_<variant>`` control: GRPO with that loop-2 mask action)."""
    return LABELS.get(name, f"GRPO, mask action {name.removeprefix('mask_')}")


@dataclass
class Row:
    """One headline metric: both systems' estimates and the paired difference (RL − SFT) on the same samples."""

    task: str
    metric: str
    label: str
    is_guarded: bool
    base: object
    rl: object
    diff: object


def compare_runs(base_dir: str | os.PathLike, rl_dir: str | os.PathLike, *, n_resamples: int = 1000,
                 seed: int = 0) -> list[Row]:
    """The headline rows of two saved evaluation runs of the same split."""
    from projects.llava_sam2.rl_train.evaluation.metrics import compare
    from projects.llava_sam2.rl_train.evaluation.results import load_run

    base, rl = load_run(str(base_dir)), load_run(str(rl_dir))
    rows = []
    for task, metric, label, guarded in HEADLINES:
        if task not in base.results or task not in rl.results:
            continue
        diff = compare(task, metric, rl.records(task), base.records(task), n_resamples=n_resamples, seed=seed)
        rows.append(Row(task, metric, label, guarded, base.results[task].metrics[metric],
                        rl.results[task].metrics[metric], diff))
    return rows


def text_blind_rate(run_dir: str | os.PathLike) -> float | None:
    """Fraction of held-out samples whose referring mask (``res``: the GT expression) and Loop-1 cycle mask (the
    model's own caption of the region) are pixel-identical: 1.0 means the segmenter ignores the text it is given,
    so the cycle IoU cannot depend on the caption. None when a task is missing."""
    from projects.llava_sam2.rl_train.evaluation.results import load_run

    run = load_run(str(run_dir))
    if "res" not in run.results or "cycle_iou" not in run.results:
        return None
    res = {r.sample_id: r.mask for r in run.records("res")}
    cycle = [(res.get(r.sample_id), r.mask) for r in run.records("cycle_iou")]
    same = [a is not None and b is not None and a.has_mask == b.has_mask and
            (a.rle == b.rle if a.rle is not None else (a.pred_area, a.intersection) == (b.pred_area, b.intersection))
            for a, b in cycle]
    return sum(same) / len(same) if same else None


def goal_checks(rows: Sequence[Row], text_change=None) -> dict[str, dict]:
    """``{check: {'passed': bool, 'detail': str}}`` for the issue's goal (module docstring); ``text_change``: the
    ``TextDependenceChange`` RL − base, when measured."""
    checks = {}
    cycle = next((r for r in rows if r.metric == "cycle_IoU"), None)
    if cycle is not None:
        gain = cycle.diff.value
        separate = cycle.rl.low > cycle.base.high
        checks["cycle_gain"] = {
            "passed": bool(cycle.diff.low > 0),
            "detail": f"cycle IoU {cycle.base.value:.3f} → {cycle.rl.value:.3f} (paired Δ {gain:+.3f}, CI "
                      f"{cycle.diff.format(3)}, above 0 needed); per-system CIs "
                      f"{'do not overlap' if separate else 'overlap'}; the share of the oracle's gain: "
                      "`sa2va-rl demo-controls --controls sft_more source_sft`"}
    regressions = [r for r in rows if r.is_guarded and r.diff is not None and r.diff.high < 0]
    checks["no_regression"] = {
        "passed": not regressions,
        "detail": "none of " + ", ".join(f"{r.task}/{r.metric}" for r in rows if r.is_guarded) + " is lower beyond "
                  "its CI" if not regressions else "lower beyond CI: " + ", ".join(
                      f"{r.task}/{r.metric} Δ {r.diff.format(3)}" for r in regressions)}
    if text_change is not None:
        gap = text_change.gap
        checks["text_gap"] = {
            "passed": not gap.high < 0,
            "detail": f"own − other-text IoU gap Δ {gap.format(3)} on {text_change.num_scenes} held-out scenes"
                      + (" (shrank beyond its CI)" if gap.high < 0 else " (not lower beyond its CI)")}
    return checks


def text_dependence_results(runs: Mapping[str, str | os.PathLike], baseline: str):
    """``({system: TextDependence-like dict}, TextDependenceChange of the other system vs the baseline or None)``
    from ``<eval dir>/text_dependence.json`` (written by the demo's text-dependence commands); empty when absent."""
    import json

    from projects.llava_sam2.rl_train.evaluation.text_dependence import compare

    found = {name: json.loads((Path(path) / TEXT_DEPENDENCE_FILE).read_text()) for name, path in runs.items()
             if (Path(path) / TEXT_DEPENDENCE_FILE).is_file()}
    other = next((n for n in found if n != baseline), None)
    change = compare(found[baseline], found[other]) if baseline in found and other else None
    return found, change


def text_dependence_markdown(found: Mapping[str, dict], change, baseline: str) -> list[str]:
    """Rows own / other / gap / identical pairs per system, plus the paired change."""
    from projects.llava_sam2.rl_train.evaluation.bootstrap import Estimate

    if not found:
        return []
    names = list(found)
    scenes = next(iter(found.values()))["num_scenes"]
    lines = ["", f"Text dependence of the segmenter ({scenes} held-out scenes with ≥ 2 objects, each object's first "
                 "referring expression; evaluation/text_dependence.py):", "",
             "| measure | " + " | ".join(names) + (" | Δ (paired, 95% CI) |" if change else " |"),
             "|---|" + "---|" * (len(names) + bool(change))]
    for key, label, scale in (("own_iou", "own IoU", 1), ("other_iou", "other-text IoU", 1),
                              ("gap", "**gap** own − other", 1), ("identical_share", "identical different-text "
                                                                                      "pairs (%)", 100)):
        cells = [Estimate(**{k: v for k, v in found[n][key].items()}).format(3 if scale == 1 else 1, scale)
                 for n in names]
        if change:
            cells.append(getattr(change, key).format(3 if scale == 1 else 1, scale))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def listener_results(runs: Mapping[str, str | os.PathLike], baseline: str):
    """``({system: listener accuracy dict}, Estimate of the other system − the baseline or None)`` from
    ``<eval dir>/listener.json`` (the demo's listener-accuracy commands); empty when absent."""
    import json

    from projects.llava_sam2.rl_train.evaluation.listener import compare

    found = {name: json.loads((Path(path) / LISTENER_FILE).read_text()) for name, path in runs.items()
             if (Path(path) / LISTENER_FILE).is_file()}
    other = next((n for n in found if n != baseline), None)
    change = compare(found[baseline], found[other]) if baseline in found and other else None
    return found, change


def listener_markdown(found: Mapping[str, dict], change) -> list[str]:
    """One row: each system's listener accuracy and the paired change."""
    from projects.llava_sam2.rl_train.evaluation.bootstrap import Estimate

    if not found:
        return []
    cells = [Estimate(**found[n]["accuracy"]).format(3) for n in found] + ([change.format(3)] if change else [])
    first = next(iter(found.values()))
    return ["", f"Listener accuracy (the frozen starting model segments each system's caption of every object of "
                f"{first['num_scenes']} held-out multi-object scenes; right object at IoU > 0.5 and above every "
                "other object; evaluation/listener.py):", "",
            "| measure | " + " | ".join(found) + (" | Δ (paired, 95% CI) |" if change else " |"),
            "|---|" + "---|" * (len(found) + bool(change)),
            "| listener accuracy | " + " | ".join(cells) + " |"]


def reward_trend(rl_work_dir: str | os.PathLike, keys: Sequence[str] = REWARD_KEYS, window: int | None = None
                 ) -> dict[str, dict[str, float]]:
    """Per loop: mean training reward over the first and the last ``window`` logged iterations of the RL run
    (``window`` None: a quarter of the run, at least 1), read from MMEngine's ``scalars.json``."""
    from projects.llava_sam2.rl_train.evaluation.plots import find_scalars, read_scalars

    rows = read_scalars(find_scalars(str(rl_work_dir)))
    out = {}
    for key in keys:
        if not any(key in row for row in rows):
            continue  # that loop was switched off (its weight 0): it logs no reward
        values = [float(row[key]) for row in rows if key in row and math.isfinite(float(row[key]))]
        if not values:
            raise ValueError(f"{rl_work_dir}: '{key}' is never finite in scalars.json")
        k = window or max(1, len(values) // 4)
        out[key] = {"first": sum(values[:k]) / k, "last": sum(values[-k:]) / k, "window": k, "n": len(values)}
    if not out:
        raise ValueError(f"{rl_work_dir}: none of {list(keys)} in scalars.json; is it a GRPO run?")
    return out


def trend_disagreements(rows: Sequence[Row], trend: Mapping[str, dict]) -> list[str]:
    """One sentence per loop whose training reward moved one way while its held-out metric moved the other way beyond
    its CI (the paired difference's CI lies entirely on one side of 0), saying why the two can disagree."""
    lines = []
    for key, metric in REWARD_METRICS.items():
        row = next((r for r in rows if r.metric == metric and r.diff is not None), None)
        if key not in trend or row is None or not (row.diff.low > 0 or row.diff.high < 0):
            continue
        reward_change, held_out_rose = trend[key]["last"] - trend[key]["first"], row.diff.low > 0
        if reward_change == 0 or (reward_change > 0) == held_out_rose:
            continue
        lines.append(
            f"`{key}` {'fell' if reward_change < 0 else 'rose'} during training ({trend[key]['first']:.3f} → "
            f"{trend[key]['last']:.3f}) while the held-out {row.label} {'rose' if held_out_rose else 'fell'} "
            f"(Δ {row.diff.format(3)}). They measure different things: the reward scores sampled rollouts "
            "(temperature as configured) on training prompts against the EMA partner, which itself changes during "
            "the run, while the held-out metric decodes greedily with the final model on held-out samples, so the "
            "training reward is not a held-out score.")
    return lines


def judge_fallbacks(rl_work_dir: str | os.PathLike) -> float:
    """Rollouts whose LLM-judge reward fell back to METEOR over the RL run (sum of the logged failure counts)."""
    from projects.llava_sam2.rl_train.evaluation.plots import find_scalars, read_scalars

    rows = read_scalars(find_scalars(str(rl_work_dir)))
    return sum(float(v) for row in rows for k, v in row.items() if "judge" in k and "/failures/" in k)


def _fmt(est) -> str:
    return "—" if est is None else est.format(3)


def summary_markdown(rows: Sequence[Row], checks: Mapping[str, dict], trend: Mapping[str, dict],
                     fallbacks: float, stages: Mapping[str, dict], names: Sequence[str],
                     blind: Mapping[str, float | None], text_lines: Sequence[str] = ()) -> str:
    lines = ["## Demo summary", "", f"| metric (held-out) | {names[0]} | {names[1]} | Δ (paired, 95% CI) |",
             "|---|---|---|---|"]
    lines += [f"| {r.label} | {_fmt(r.base)} | {_fmt(r.rl)} | {_fmt(r.diff)} |" for r in rows]
    lines += list(text_lines)
    lines += ["", "The demo's goals (one seed here; the multi-seed results are in docs/demo.md):", ""]
    lines += [f"* {'✅' if c['passed'] else '❌'} `{name}`: {c['detail']}" for name, c in checks.items()]
    lines += ["", "Held-out samples whose mask for the GT expression (`res`) and for the model's own caption "
                  "(`cycle_iou`) are pixel-identical — "
              + ", ".join(f"{name}: {rate:.0%}" for name, rate in blind.items() if rate is not None)
              + ". Near 100% would mean the masks ignore the text, so a cycle-IoU change would be a segmentation "
                "change, not a caption change."]
    lines += ["", "Training reward of the RL run (mean over the first / last logged iterations):", ""]
    lines += [f"* `{key}`: {t['first']:.3f} → {t['last']:.3f} (windows of {t['window']} of {t['n']} iterations)"
              for key, t in trend.items()]
    disagreements = trend_disagreements(rows, trend)
    lines += ["", *disagreements] if disagreements else []
    if fallbacks:
        lines += ["", f"Caption reward: no LLM-judge endpoint was configured, so {fallbacks:g} loop-2 rollouts fell "
                      "back to METEOR alone (weights re-normalised; docs/rewards.md)."]
    lines += ["", "| stage | wall s | CPU s |", "|---|---|---|"]
    lines += [f"| {name} | {rec.get('wall_s', 0):.0f} | {rec.get('cpu_s', 0):.0f} |" for name, rec in stages.items()]
    return "\n".join(lines) + "\n"


def summary_terminal(rows: Sequence[Row], checks: Mapping[str, dict], trend: Mapping[str, dict],
                     names: Sequence[str]) -> str:
    width = max(len(r.label) for r in rows) if rows else 10
    lines = [f"{'held-out metric':<{width}}  {names[0]:>22}  {names[1]:>22}  {'Δ paired [95% CI]':>26}"]
    lines += [f"{r.label:<{width}}  {_fmt(r.base):>22}  {_fmt(r.rl):>22}  {_fmt(r.diff):>26}" for r in rows]
    lines += [""] + [f"{key}: {t['first']:.3f} → {t['last']:.3f}" for key, t in trend.items()]
    lines += trend_disagreements(rows, trend)
    lines += [f"{'PASS' if c['passed'] else 'MISS'} {name}: {c['detail']}" for name, c in checks.items()]
    return "\n".join(lines)


def summarize_demo(work_dir: str | os.PathLike, runs: Mapping[str, str | os.PathLike], baseline: str, *,
                   rl_work_dir: str | os.PathLike, num_examples: int = 4, stages: Mapping[str, dict] = ()) -> dict:
    """Write ``work_dir/report.md`` (evaluation report with the demo summary on top) and print the summary."""
    from projects.llava_sam2.rl_train.evaluation.report import write_report

    names = list(runs)
    other = next(n for n in names if n != baseline)
    report = write_report(str(work_dir), {n: str(p) for n, p in runs.items()}, baseline=baseline,
                          scalars=str(rl_work_dir), num_examples=num_examples,
                          title="Sa2VA-RL embedded demo: tiny Sa2VA on the shapes world (CPU)")
    rows = compare_runs(runs[baseline], runs[other])
    found, change = text_dependence_results(runs, baseline)
    checks, trend = goal_checks(rows, change), reward_trend(rl_work_dir)
    blind = {name: text_blind_rate(path) for name, path in runs.items()}
    text_lines = text_dependence_markdown(found, change, baseline)
    heard, heard_change = listener_results(runs, baseline)
    text_lines += listener_markdown(heard, heard_change)
    summary = summary_markdown(rows, checks, trend, judge_fallbacks(rl_work_dir), dict(stages), [baseline, other],
                               blind, text_lines)
    text = Path(report).read_text(encoding="utf-8")
    title, _, rest = text.partition("\n")
    Path(report).write_text(f"{title}\n\n{summary}\n{rest}", encoding="utf-8")
    print(summary_terminal(rows, checks, trend, [baseline, other]))
    if text_lines:
        print("\n".join(text_lines[3:]))
    print("segmenter ignores the text on " + ", ".join(f"{n}: {r:.0%}" for n, r in blind.items() if r is not None)
          + " of the held-out samples (identical masks for the GT expression and the model's caption)")
    print(f"\nreport: {report}")
    return {"report": report, "checks": checks, "reward_trend": trend, "text_blind_rate": blind,
            "listener": {"systems": {n: r["accuracy"] for n, r in heard.items()},
                         "change": None if heard_change is None else heard_change.to_dict()},
            "text_dependence": {"systems": {n: {k: v for k, v in r.items() if k != "scenes"} for n, r in found.items()},
                                "change": None if change is None else change.to_dict()},
            "metrics": {f"{r.task}/{r.metric}": {"base": r.base.to_dict(), "rl": r.rl.to_dict(),
                                                 "diff": None if r.diff is None else r.diff.to_dict()}
                        for r in rows}}
