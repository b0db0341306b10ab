"""One markdown report + PNG bar charts of every prompt-RL experiment, all on the same held-out split.

    sa2va-rl prompt-rl report --run-dir work_dirs/prompt_rl [--out work_dirs/prompt_rl/report]

RUN_DIR holds the outputs of the documented pipeline (docs/prompt_rl.md): segmenter/train_log.json,
quality/ (cache), reward_net/quality_model_results.json, policy/prompt_policy_results.json,
postprocess/postprocess_results.json and, when the GRPO step ran, quality_grpo/ (the fine-tuned checkpoint's cache
built with --same-as quality/) and grpo/ (the MMEngine work dir: its scalars.json gives the reward curve and the
time per iteration); further GRPO variants as quality_grpo<suffix>/ + grpo<suffix>/. Missing optional parts are
listed as "not run".
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from projects.llava_sam2.rl_train.prompt_rl import report as R
from projects.llava_sam2.rl_train.prompt_rl.quality_data import load_quality_data

PROG = "sa2va-rl prompt-rl report"


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _bars(ax, labels, entries, title, ylabel, ref=None):
    """Horizontal bars with CI whiskers from Estimate dicts."""
    values = np.array([e["value"] for e in entries])
    low = np.array([e["value"] - e["low"] if np.isfinite(e["low"]) else 0 for e in entries])
    high = np.array([e["high"] - e["value"] if np.isfinite(e["high"]) else 0 for e in entries])
    y = np.arange(len(labels))
    ax.barh(y, values, xerr=[low, high], color="#4878a8", ecolor="black", capsize=3)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_title(title)
    ax.set_xlabel(ylabel)
    if ref is not None:
        ax.axvline(ref, color="grey", linestyle="--", linewidth=1)


def plot_quality(results: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    names = list(results["heldout"])
    fig, axes = plt.subplots(1, 4, figsize=(16, 2.6 + 0.3 * len(names)))
    for ax, metric in zip(axes, R.QUALITY_COLUMNS):
        entries = [results["heldout"][n][metric] for n in names]
        _bars(ax, names, [e if np.isfinite(e["value"]) else {**e, "value": 0.0} for e in entries], metric,
              "held-out")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_selection(results: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    methods = sorted(results["methods"].items(), key=lambda kv: -kv[1]["dice"]["value"])
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.4 * len(methods)))
    _bars(ax, [n for n, _ in methods], [m["dice"] for _, m in methods], "Prompt selection (held-out Dice, 95% CI)",
          "Dice", ref=results["methods"]["default"]["dice"]["value"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_pairs(rows: dict[str, tuple[dict, dict]], names: tuple[str, str], title: str, path: Path) -> None:
    """Grouped bars: two systems per row label (e.g. untouched vs tuned)."""
    import matplotlib.pyplot as plt

    labels = list(rows)
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.6 * len(labels)))
    y = np.arange(len(labels))
    for offset, (index, name) in zip((-0.2, 0.2), enumerate(names)):
        entries = [rows[label][index] for label in labels]
        values = np.array([e["value"] for e in entries])
        err = [[e["value"] - e["low"] for e in entries], [e["high"] - e["value"] for e in entries]]
        ax.barh(y + offset, values, height=0.4, xerr=err, capsize=3, label=name)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel("held-out Dice")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_report(run: Path, out: Path, n_resamples: int) -> str:
    seg, quality = _read(run / "segmenter" / "train_log.json"), load_quality_data(run / "quality")
    rn = _read(run / "reward_net" / "quality_model_results.json")
    pol = _read(run / "policy" / "prompt_policy_results.json")
    post = _read(run / "postprocess" / "postprocess_results.json")
    held, train = quality.split_indices("heldout"), quality.split_indices("train")
    lines = ["# Prompt-RL line: quality model, prompt selection, post-processing, reward-guided fine-tuning", "",
             f"Held-out split: **{len(held)} images** (train: {len(train)}), K = {quality.num_prompts} prompts "
             f"({', '.join(quality.meta['prompt_labels'])}); source {quality.meta['source']}. All methods below are "
             "measured on these held-out images; CIs are 95% percentile bootstrap over images.", ""]
    if seg:
        h = seg["held_out"]
        lines += ["## Segmenter", "", f"Checkpoint {quality.meta.get('checkpoint')}: {seg['args']['steps']} SFT steps "
                  f"in {seg['train_seconds']} s; on {h['num_samples']} ShapesWorld('val') images with the default prompt: "
                  f"mean IoU {h['mean_iou']}, Dice {h['mean_dice']}, cIoU {h['cIoU']}; greedy answers emit [SEG] in "
                  f"{h['greedy']['seg_rate']:.0%} of {h['greedy']['num_samples']} cases.", ""]
        ts = h.get("text_sensitivity") or {}
        if ts.get("num_scenes"):
            lines += [f"Text sensitivity on {ts['num_scenes']} multi-object scenes: Dice with the target is "
                      f"{ts['dice_target_prompt']} when the target is named and {ts['dice_distractor_prompt']} when "
                      "another object is named (equal values: the model ignores the text).", ""]
    else:
        lines += ["## Segmenter", "", f"Checkpoint {quality.meta.get('checkpoint')} (not trained by the `segmenter` "
                  "step: no segmenter/train_log.json in the run directory).", ""]
    spread = quality.dice[held].std(1).mean()
    lines += [f"Prompt sensitivity: mean within-image std of Dice across the K prompts = {spread:.4f}; "
              f"degenerate masks in the cache: {quality.meta['degenerate']}.", ""]
    if rn:
        plot_quality(rn, out / "quality_model.png")
        lines += ["## Quality model (GT-free Dice prediction)", "", R.quality_table(rn), "",
                  f"Failure rate (Dice < {rn['failure_threshold']}) on held-out pairs: {rn['heldout_failure_rate']:.3f}. "
                  f"Scorer used downstream: **{rn['selected_scorer']}** (best validation Spearman; the network only "
                  "if it beats every free baseline).", "", "![quality](quality_model.png)", ""]
    if pol:
        plot_selection(pol, out / "prompt_selection.png")
        m = pol["methods"]
        lines += ["## Prompt selection", "", R.selection_table(pol), "",
                  f"Policies learn from the GT-free reward `{pol['reward_scorer']}` on train images; PPO ran at "
                  f"{pol['stats']['ppo']['steps_per_second']} env steps/s on CPU.", ""]
        for name in m:
            if name.startswith(("ppo", "linucb", "rerank")):
                lines.append("* " + R.verdict(m[name]["dice_minus_best_fixed"], f"{name} vs best fixed"))
        lines += ["", "![selection](prompt_selection.png)", ""]
    if post:
        rows = {name: (r["heldout"]["untouched"], r["heldout"]["tuned"]) for name, r in post["choices"].items()}
        plot_pairs(rows, ("untouched", "tuned"), "Post-processing of mask logits", out / "postprocess.png")
        lines += ["## Post-processing (threshold + morphology on logits)", "", R.postprocess_table(post), "",
                  "![postprocess](postprocess.png)", ""]
    lines += finetune_section(run, quality, out, n_resamples)
    return "\n".join(lines) + "\n"


def finetune_section(run: Path, quality, out: Path, n_resamples: int) -> list[str]:
    """One table per fine-tuned cache ``quality_grpo<suffix>/`` (its GRPO work dir is ``grpo<suffix>/``)."""
    caches = sorted(p for p in run.glob("quality_grpo*") if (p / "meta.json").is_file())
    lines = ["## Reward-guided fine-tuning (GRPO caption→mask loop, reward = reward_net_dice)", ""]
    if not caches:
        return lines + ["Not run (no quality_grpo*/ cache in the run directory).", ""]
    for cache in caches:
        suffix = cache.name[len("quality_grpo"):]
        comparison = R.compare_checkpoints(quality, load_quality_data(cache), n_resamples=n_resamples)
        rows = {name: (r["base"], r["tuned"]) for name, r in comparison.items()}
        chart = f"finetune{suffix}.png"
        plot_pairs(rows, ("base", f"GRPO{suffix}"), f"Reward-guided fine-tuning{suffix}", out / chart)
        lines += [f"### Run `grpo{suffix}`", "", R.finetune_table(comparison), "",
                  "* " + R.verdict(comparison["default prompt"]["tuned_minus_base"], "fine-tuned vs base, default prompt"),
                  f"* GRPO log: {grpo_summary(run / f'grpo{suffix}')}", "", f"![finetune]({chart})", ""]
    return lines


def grpo_summary(work_dir: Path) -> dict:
    """Iterations, mean seconds per iteration and the loop-2 reward at the start and end of the newest GRPO log."""
    logs = sorted(work_dir.glob("*/vis_data/scalars.json"))
    if not logs:
        return {"log": "not found"}
    rows = [json.loads(line) for line in logs[-1].read_text().splitlines() if line.strip()]
    rewards = [r["caption_to_mask/reward_mean"] for r in rows if "caption_to_mask/reward_mean" in r]
    times = [r["time"] for r in rows if "time" in r]
    k = max(1, len(rewards) // 5)
    return {"iterations": len(rows), "seconds_per_iteration": round(float(np.mean(times)), 2) if times else None,
            "reward_first_fifth": round(float(np.mean(rewards[:k])), 4) if rewards else None,
            "reward_last_fifth": round(float(np.mean(rewards[-k:])), 4) if rewards else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="directory of the pipeline outputs")
    parser.add_argument("--out", default=None, help="report directory (default RUN_DIR/report)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the fine-tune table")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    run = Path(args.run_dir)
    out = Path(args.out) if args.out else run / "report"
    out.mkdir(parents=True, exist_ok=True)
    text = build_report(run, out, args.bootstrap)
    (out / "prompt_rl_report.md").write_text(text)
    print(f"wrote {out / 'prompt_rl_report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
