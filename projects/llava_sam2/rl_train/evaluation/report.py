"""Markdown report over several evaluation runs of the same split (systems / controls), with figures.

``write_report`` writes ``report.md`` plus PNGs into ``out_dir``:

* a table per task: systems × metrics, each cell ``estimate [95% CI]``, and n;
* paired differences against a baseline system (paired bootstrap over the same samples): the
  evidence for a gain is a difference CI that excludes 0;
* ``metrics.png`` (bars with CI whiskers), ``curves.png`` (training reward curves from MMEngine's
  ``scalars.json``, when given), ``examples_<task>.png`` (held-out samples: GT vs each system).
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from .bootstrap import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, Estimate
from .metrics import METRICS, PRIMARY, TASKS, compare
from .plots import plot_curves, plot_examples, plot_metric_bars
from .results import Run, build_dataset, load_run

NOTES = """\
## How to read this

* Every number is computed on the held-out split named above; all systems were scored on the same samples.
* `estimate [low, high]`: percentile bootstrap 95% CI over samples ({n_resamples} resamples, seed {seed}).
  "Δ vs baseline" is a *paired* bootstrap of the difference on the same samples. A difference is marked ✅ (a gain:
  higher is better, except for the `*_rate` columns) or ⚠️ (a loss) only when its CI excludes 0 *as printed* (both
  bounds non-zero at 3 decimals, same sign) and |Δ| ≥ {min_effect} (half a point on these 0-1 metrics; one
  sample in 200 moving by 1.0 is 0.005). Smaller or rounded-to-zero changes get no mark, whatever their CI.
* RES: `cIoU` = Σ∩ / Σ∪ over samples, `gIoU` = mean per-sample IoU (Sa2VA's `RES.evaluate`). An answer without a
  fed-back `[SEG]` is an empty prediction: IoU 0 in gIoU and its ground-truth area still counts in Σ∪ of cIoU;
  `cIoU_seg_only` leaves those samples out, `no_seg_rate` counts them.
* Captions: `METEOR_nltk` is nltk's METEOR (mean over samples); `METEOR15_*` is the official METEOR 1.5 jar
  (corpus score and sentence mean). nltk runs ~1.7-1.9x higher than the jar; never compare across the two.
* `cycle_IoU` (Loop 1: mask → caption → mask') and `cycle_METEOR_nltk` (Loop 2: caption → mask → caption')
  use the evaluated model as both A and B unless the setup table names a partner; greedy decoding everywhere.
"""


def _cell(est: Estimate | None, digits: int = 3) -> str:
    return "—" if est is None else est.format(digits)


def _metric_names(task: str, runs: Mapping[str, Run]) -> list[str]:
    """Metrics present in any run, headline metrics first, then the table order."""
    present = {name for run in runs.values() if task in run.results for name in run.results[task].metrics}
    ordered = [m.name for m in METRICS[task]]
    return [n for n in PRIMARY[task] if n in present] + [n for n in ordered if n in present and n not in PRIMARY[task]]


def metrics_table(task: str, runs: Mapping[str, Run]) -> str:
    """Markdown table: one row per system that ran ``task``."""
    names = _metric_names(task, runs)
    has_corpus = any(run.results[task].meteor15_corpus is not None for run in runs.values() if task in run.results)
    header = ["system", "n", *names] + (["METEOR15_corpus"] if has_corpus else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for system, run in runs.items():
        if task not in run.results:
            continue
        result = run.results[task]
        cells = [system, str(len(result.records)), *(_cell(result.metrics.get(n)) for n in names)]
        if has_corpus:
            cells.append("—" if result.meteor15_corpus is None else f"{result.meteor15_corpus:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def differences_table(task: str, runs: Mapping[str, Run], baseline: str, **knobs) -> str:
    """Markdown table of metric(system) − metric(baseline) with paired-bootstrap CIs."""
    metrics = [m for m in METRICS[task] if m.name in _metric_names(task, runs)]
    names = [m.name for m in metrics]
    others = [s for s, run in runs.items() if s != baseline and task in run.results]
    if task not in runs[baseline].results or not others or not names:
        return ""
    lines = ["| system − " + baseline + " | " + " | ".join(f"Δ {n}" for n in names) + " |",
             "|" + "---|" * (len(names) + 1)]
    for system in others:
        cells = []
        for metric in metrics:
            diff = compare(task, metric.name, runs[system].records(task), runs[baseline].records(task), **knobs)
            cells.append("—" if diff is None else diff.format(3) + _mark(diff, metric.higher_is_better))
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


MIN_EFFECT = 0.005  # smallest |Δ| a mark can claim: half a point on the report's 0-1 metrics


def is_marked(diff: Estimate, digits: int = 3, min_effect: float = MIN_EFFECT) -> bool:
    """Whether a paired difference earns a ✅/⚠️: its CI excludes 0 as displayed with ``digits`` decimals (both
    printed bounds non-zero and of one sign, so a mark never sits beside a ``0.000`` bound) and
    ``|value| >= min_effect``."""
    if not diff.excludes_zero:
        return False
    low, high = (float(f"{bound:.{digits}f}") for bound in (diff.low, diff.high))
    return (low > 0 or high < 0) and abs(diff.value) >= min_effect


def _mark(diff: Estimate, higher_is_better: bool) -> str:
    """' ✅' for a marked gain, ' ⚠️' for a marked loss (:func:`is_marked`), else ''."""
    if not is_marked(diff):
        return ""
    return " ✅" if (diff.value > 0) == higher_is_better else " ⚠️"


def _pick_examples(sample_ids: Sequence[str], count: int) -> list[str]:
    """``count`` ids evenly spaced over the split (not chosen by score)."""
    if count <= 0 or not sample_ids:
        return []
    if count >= len(sample_ids):
        return list(sample_ids)
    return [sample_ids[round(k * (len(sample_ids) - 1) / (count - 1))] if count > 1 else sample_ids[0]
            for k in range(count)]


def _load_samples(dataset, ids: Sequence[str], hints: Mapping[str, int]) -> list:
    """Samples by id; a record's position in its file is tried first as the dataset index."""
    wanted, found = set(ids), {}
    for sample_id in ids:
        index = hints.get(sample_id)
        if index is not None and index < len(dataset):
            sample = dataset[index]
            if getattr(sample, "sample_id", None) == sample_id:
                found[sample_id] = sample
    for index in range(len(dataset)):
        if wanted <= set(found):
            break
        sample = dataset[index]
        if getattr(sample, "sample_id", None) in wanted:
            found[sample.sample_id] = sample
    missing = sorted(wanted - set(found))
    if missing:
        raise ValueError(f"examples: samples {missing[:3]} are not in the dataset of the runs; pass the dataset the "
                         "runs were evaluated on")
    return [found[i] for i in ids]


def _example_figures(out_dir: str, runs: Mapping[str, Run], dataset, num_examples: int) -> list[tuple[str, str]]:
    figures = []
    for task in TASKS:
        systems = {s: run for s, run in runs.items() if task in run.results}
        if not systems:
            continue
        first = next(iter(systems.values())).records(task)
        common = [r.sample_id for r in first if all(r.sample_id in {x.sample_id for x in run.records(task)}
                                                    for run in systems.values())]
        ids = _pick_examples(common, num_examples)
        samples = _load_samples(dataset, ids, {r.sample_id: k for k, r in enumerate(first)})
        by_id = {s: {r.sample_id: r for r in run.records(task)} for s, run in systems.items()}
        path = plot_examples(task, samples, by_id, os.path.join(out_dir, f"examples_{task}.png"))
        figures.append((f"Examples: {task}", os.path.basename(path)))
    return figures


def write_report(out_dir: str, runs: Mapping[str, str | Run], *, baseline: str | None = None,
                 scalars: str | None = None, curves: Mapping[str, str] | None = None, smooth: int | None = None,
                 dataset=None, num_examples: int = 4, title: str = "Sa2VA-RL held-out evaluation",
                 n_resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE, seed: int = 0) -> str:
    """Write ``out_dir/report.md`` and its PNGs; returns the report path.

    Args:
        runs: system name → run directory (``sa2va-rl evaluate --out``) or a loaded :class:`Run`.
        baseline: system the others are compared with (default: the first).
        scalars: training work_dir or ``scalars.json`` for reward curves (skipped when None).
        curves: panel title → scalar key (default: ``mask_to_caption/reward_mean``,
            ``caption_to_mask/reward_mean``).
        dataset: the evaluated dataset for example figures (default: rebuilt from the baseline run's spec;
            ``num_examples=0`` skips the figures).
    """
    if not runs:
        raise ValueError("write_report: no runs given; pass name=run_dir pairs")
    runs = {name: run if isinstance(run, Run) else load_run(run) for name, run in runs.items()}
    baseline = baseline or next(iter(runs))
    if baseline not in runs:
        raise ValueError(f"write_report: baseline={baseline!r} is not one of the systems {list(runs)}")
    os.makedirs(out_dir, exist_ok=True)
    knobs = dict(n_resamples=n_resamples, confidence=confidence, seed=seed)
    lines = [f"# {title}", "", _setup_section(runs, baseline), ""]
    for task in TASKS:
        if not any(task in run.results for run in runs.values()):
            continue
        lines += [f"## {task}", "", metrics_table(task, runs), ""]
        diffs = differences_table(task, runs, baseline, **knobs)
        if diffs:
            lines += [f"Paired differences vs `{baseline}`:", "", diffs, ""]
    figures = [("Headline metrics", os.path.basename(plot_metric_bars(
        {s: {t: r.metrics for t, r in run.results.items()} for s, run in runs.items()},
        os.path.join(out_dir, "metrics.png"))))]
    if scalars is not None:
        figures.append(("Training reward curves", os.path.basename(
            plot_curves(scalars, os.path.join(out_dir, "curves.png"), curves, smooth))))
    if num_examples > 0:
        dataset = dataset if dataset is not None else build_dataset(runs[baseline].meta.get("dataset", {}))
        figures += _example_figures(out_dir, runs, dataset, num_examples)
    lines += ["## Figures", ""] + [f"### {caption}\n\n![{caption}]({name})\n" for caption, name in figures]
    lines += [NOTES.format(n_resamples=n_resamples, seed=seed, min_effect=MIN_EFFECT)]
    path = os.path.join(out_dir, "report.md")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))
    return path


def _setup_section(runs: Mapping[str, Run], baseline: str) -> str:
    """Systems and their sources; the split."""
    lines = ["## Setup", "", "| system | model | partner (B) | run |", "|---|---|---|---|"]
    for system, run in runs.items():
        model = run.meta.get("model", {})
        mark = " (baseline)" if system == baseline else ""
        lines.append(f"| {system}{mark} | {model.get('source', '?')} | {model.get('partner', 'same model')} | "
                     f"`{run.path}` |")
    spec = runs[baseline].meta.get("dataset")
    config = runs[baseline].meta.get("config", {})
    lines += ["", f"Split: `{spec}`; decoding greedy, max_new_tokens={config.get('max_new_tokens', '?')}, "
              f"caption cleaning `{config.get('caption_cleaning', '?')}`."]
    n = {len(r.records) for run in runs.values() for r in run.results.values()}
    if n and min(n) < 200:
        lines.append(f"\n⚠️ Fewer than 200 samples per task (n = {sorted(n)}): CIs are wide.")
    return "\n".join(lines)
