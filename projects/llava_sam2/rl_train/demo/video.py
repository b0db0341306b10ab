"""The video demo's pieces (``sa2va-rl demo --video``): its data, GRPO data options, evaluation and report. The stages,
their bookkeeping and the commands are demo/pipeline.py's; this module only says what differs on video.

Domain adaptation as the image demo: the start model knows source clips (ShapesVideoWorld ``domain='source'``); GRPO
adapts it to target clips (the same moving scenes and vocabulary, every frame's pixels shifted the same way) from
unpaired target data only, written in the real on-disk layouts and read back by the real loaders:

* ``data/rl_regions``: SA-V layout (``write_sav``: masklets without text), loop 1's data (``SAVMaskletDataset``);
* ``data/rl_texts``: MeViS layout (``write_mevis``) of other clips, loop 2's data (``MeViSDataset``; the unpaired zip
  drops their masklets, so no loop sees a paired (text, masklet));
* ``data/eval``: MeViS layout of the held-out ``--eval-split`` clips (``test`` for reporting, ``val`` for choosing),
  scored with every frame by ``sa2va-rl evaluate --dataset mevis`` on the video cycle tasks
  (evaluation/video_cycle_tasks.py).

The report (``WORK_DIR/report.md``) holds the held-out table (base vs GRPO with the paired difference and its 95 %
bootstrap CI), the training reward curve of each loop and, for a few held-out clips, the before/after masklet strips
of the loop-1 cycle (the masklet the model segments from its own key-frame caption).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

# (task, metric, label) of the held-out table, in order
VIDEO_HEADLINES = (
    ("video_cycle_jf", "cycle_JF", "video Loop-1 cycle J&F (masklet → key-frame caption → masklet')"),
    ("video_cycle_jf", "cycle_J", "video Loop-1 cycle J (region similarity)"),
    ("video_cycle_jf", "cycle_F", "video Loop-1 cycle F (boundary)"),
    ("video_cycle_caption", "cycle_METEOR_nltk", "video Loop-2 cycle METEOR (expression → masklet → caption')"),
    ("video_res", "j_and_f", "video referring J&F vs GT (expression → masklet)"),
    ("video_res", "j_and_f_memory_free", "video referring J&F, frames the language model saw"),
    ("video_res", "j_and_f_propagated", "video referring J&F, propagated frames (SAM2 memory)"),
)
VIDEO_EVAL_TASKS = ("video_res", "video_cycle_jf", "video_cycle_caption")
REWARD_CURVES = {"Loop 1 reward: J&F (masklet → caption → masklet')": "mask_to_caption/reward_mean",
                 "Loop 2 reward (expression → mask → caption')": "caption_to_mask/reward_mean"}


def world(s, split: str, count: int, start: int = 0):
    """The demo's target-domain ShapesVideoWorld of ``split`` (``count`` clips from ``start``)."""
    from projects.llava_sam2.rl_train.data.shapes_video import ShapesVideoWorld

    return ShapesVideoWorld(split, count, s.data_seed, image_size=s.image_size, num_frames=s.num_frames,
                            start=start, **s.world)


def stage_data_video(s) -> dict:
    """Write the RL clips (two disjoint halves of the training clips: SA-V masklets / MeViS expressions) and the
    held-out clips (MeViS), then read every set back through its loader, so a layout problem stops the demo here."""
    from projects.llava_sam2.rl_train.data.video_formats.mevis import MeViSDataset
    from projects.llava_sam2.rl_train.data.video_formats.sav import SAVMaskletDataset

    half = s.train_samples // 2
    files = {"rl_regions": world(s, "train", half).write_sav(str(s.path("data/rl_regions"))),
             "rl_texts": world(s, "train", s.train_samples - half, start=half).write_mevis(str(s.path("data/rl_texts"))),
             "eval": world(s, s.eval_split, s.val_samples).write_mevis(str(s.path("data/eval")))}
    counts = {"rl_regions": len(SAVMaskletDataset(**files["rl_regions"], num_frames=None)),
              "rl_texts": len(MeViSDataset(**files["rl_texts"], num_frames=None)),
              "eval": len(MeViSDataset(**files["eval"], num_frames=None))}
    for name, layout in (("rl_regions", "SA-V masklets, no text"), ("rl_texts", "MeViS, masks dropped in RL"),
                         ("eval", f"MeViS, held-out {s.eval_split!r}")):
        print(f"  {name}: {counts[name]} {s.world['domain']} clips of {s.num_frames} frames ({layout}) -> "
              f"{s.path('data', name)}")
    return {"files": files, "clips": counts}


def rl_video_options(s) -> list[str]:
    """--cfg-options pointing grpo_shapes_video_cpu.py's two unpaired sets at the demo's files, and the MLLM frames."""
    regions, texts = s.path("data/rl_regions"), s.path("data/rl_texts")
    return [f"train_dataloader.dataset.regions.annotation_root={regions / 'sav_train'}",
            f"train_dataloader.dataset.regions.frames_root={regions / 'JPEGImages_24fps'}",
            f"train_dataloader.dataset.texts.expression_file={texts / 'meta_expressions.json'}",
            f"train_dataloader.dataset.texts.mask_file={texts / 'mask_dict.json'}",
            f"train_dataloader.dataset.texts.image_root={texts / 'JPEGImages'}",
            f"train_cfg.algorithm.config.video_mllm_frames={s.video_mllm_frames}"]


def video_eval_arguments(s) -> list[str]:
    """``sa2va-rl evaluate`` flags of the held-out clips and the video tasks."""
    data = s.path("data/eval")
    return ["--dataset", "mevis", "--expression-file", str(data / "meta_expressions.json"),
            "--mask-file", str(data / "mask_dict.json"), "--image-root", str(data / "JPEGImages"),
            "--name", f"shapes_video_{s.world['domain']}_{s.eval_split}", "--num-samples", str(s.val_samples),
            "--tasks", *VIDEO_EVAL_TASKS, "--video-mllm-frames", str(s.video_mllm_frames),
            "--batch-size", str(s.eval_batch_size), "--max-new-tokens", str(s.eval_max_new_tokens)]


def held_out_rows(base_dir, rl_dir, n_resamples: int = 1000) -> list[dict]:
    """Per headline metric: the two systems' estimates and the paired difference RL − base (95 % bootstrap CI)."""
    from projects.llava_sam2.rl_train.evaluation.metrics import compare
    from projects.llava_sam2.rl_train.evaluation.results import load_run

    base, rl = load_run(str(base_dir)), load_run(str(rl_dir))
    rows = []
    for task, metric, label in VIDEO_HEADLINES:
        if task not in base.results or task not in rl.results:
            continue
        diff = compare(task, metric, rl.records(task), base.records(task), n_resamples=n_resamples)
        rows.append({"task": task, "metric": metric, "label": label, "base": base.results[task].metrics[metric],
                     "rl": rl.results[task].metrics[metric], "diff": diff})
    return rows


def masklet_of(record, size: tuple[int, int]) -> np.ndarray:
    """A video record's scored masklet bool ``[T, H, W]`` (all False when it has none: an empty prediction)."""
    from projects.llava_sam2.rl_train.data.rle import decode_rle

    if record.masklet is None:
        return np.zeros((len(record.frame_j), *size), dtype=bool)
    return np.stack([decode_rle(rle, *size, file="records", sample_id=record.sample_id) for rle in record.masklet])


def example_strips(s, names: dict[str, str], count: int) -> list[tuple[str, str]]:
    """Before/after strips of the loop-1 cycle for the first ``count`` held-out clips: (caption, PNG path)."""
    from projects.llava_sam2.rl_train.evaluation.plots import plot_video_strip
    from projects.llava_sam2.rl_train.evaluation.results import build_dataset, load_run

    runs = {key: load_run(str(s.path("eval", key))) for key in ("base", "rl")}
    dataset = build_dataset(runs["base"].meta["dataset"])
    out = s.path("examples")
    out.mkdir(parents=True, exist_ok=True)
    figures = []
    for index in range(min(count, len(dataset))):
        sample = dataset[index]
        size = np.asarray(sample.gt_masks).shape[1:]
        for key in ("base", "rl"):
            record = next(r for r in runs[key].records("video_cycle_jf") if r.sample_id == sample.sample_id)
            title = f"{names[key]}: caption “{record.caption}” → J&F {record.score:.2f}"
            png = out / f"video_cycle_{index}_{key}.png"
            plot_video_strip(sample, str(png), masklet_of(record, size), title=title)
            figures.append((f"{sample.sample_id}, {names[key]}", str(png)))
    return figures


def _cell(estimate) -> str:
    return "—" if estimate is None else estimate.format(3)


def video_report(s, stages: dict) -> dict:
    """``WORK_DIR/report.md`` with the held-out table, the reward curves and the example strips; prints the table."""
    from projects.llava_sam2.rl_train.demo.summary import reward_trend
    from projects.llava_sam2.rl_train.evaluation.plots import plot_curves

    names = s.systems
    rows = held_out_rows(s.path("eval/base"), s.path("eval/rl"))
    curves = s.path("reward_curves.png")
    plot_curves(str(s.path("rl")), str(curves), REWARD_CURVES)
    trend = reward_trend(s.path("rl"))
    strips = example_strips(s, names, s.num_examples)
    lines = ["# Sa2VA-RL video demo: tiny Sa2VA on moving shapes clips (CPU)", "",
             f"Start checkpoint `{s.start_checkpoint}`; GRPO `{Path(s.rl_config).name}` (seed {s.seed}) on "
             f"{s.train_samples} unpaired {s.world['domain']}-domain training clips (half SA-V masklets without text, "
             f"half MeViS expressions without masks); {s.num_frames} frames of {s.image_size} px per clip, the "
             f"first {s.video_mllm_frames} to the language model. Held-out: {rows[0]['base'].n if rows else 0} "
             f"clips of the `{s.eval_split}` split, every frame scored."
             + ("" if Path(s.start_checkpoint).name == "tiny_video_pretrained" else
                " The start checkpoint is not the video-pretrained tiny model: its SAM2 memory may be untrained, so "
                "its propagated frames say little."), "",
             f"| metric (held-out) | {names['base']} | {names['rl']} | Δ (paired, 95% CI) |", "|---|---|---|---|"]
    lines += [f"| {r['label']} | {_cell(r['base'])} | {_cell(r['rl'])} | {_cell(r['diff'])} |" for r in rows]
    lines += ["", "Training reward (mean over the first / last logged iterations):", ""]
    lines += [f"* `{key}`: {t['first']:.3f} → {t['last']:.3f} (windows of {t['window']} of {t['n']} iterations)"
              for key, t in trend.items()]
    lines += ["", f"![reward curves]({curves.name})", "", "## Loop-1 cycle on held-out clips, before and after GRPO",
              "", "Top row: the ground-truth masklet (cyan outline, key frame marked); bottom row: the masklet the "
              "model segments from its own caption of the key-frame region (magenta).", ""]
    lines += [f"**{caption}**\n\n![{caption}]({Path(png).relative_to(s.work_dir)})\n" for caption, png in strips]
    lines += ["", "| stage | wall s | CPU s |", "|---|---|---|"]
    lines += [f"| {name} | {rec.get('wall_s', 0):.0f} | {rec.get('cpu_s', 0):.0f} |" for name, rec in stages.items()]
    report = s.path("report.md")
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    width = max(len(r["label"]) for r in rows)
    for r in rows:
        print(f"{r['label']:<{width}}  {_cell(r['base']):>22}  {_cell(r['rl']):>22}  {_cell(r['diff']):>26}")
    print(f"\nreport: {report}")
    metrics = {f"{r['task']}/{r['metric']}": {k: None if r[k] is None else r[k].to_dict()
                                               for k in ("base", "rl", "diff")} for r in rows}
    return {"report": str(report), "metrics": metrics, "reward_trend": trend}


def seed_table(work_dirs: dict[int, Path], n_resamples: int = 1000) -> str:
    """Markdown table of the paired differences RL − base (95 % CI) of every headline metric, one row per seed (its
    demo work dir), and their mean ± standard deviation over the seeds."""
    per_seed = {seed: {(r["task"], r["metric"]): r for r in held_out_rows(Path(d) / "eval/base", Path(d) / "eval/rl",
                                                                           n_resamples)}
                for seed, d in work_dirs.items()}
    keys = [(t, m) for t, m, _ in VIDEO_HEADLINES if all((t, m) in rows for rows in per_seed.values())]
    labels = {(t, m): label for t, m, label in VIDEO_HEADLINES}
    lines = ["| seed | " + " | ".join(f"Δ {labels[k]}" for k in keys) + " |", "|---|" + "---|" * len(keys)]
    for seed, rows in per_seed.items():
        cells = [f"{rows[k]['diff'].value:+.3f} [{rows[k]['diff'].low:+.3f}, {rows[k]['diff'].high:+.3f}]"
                 for k in keys]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    deltas = {k: [rows[k]["diff"].value for rows in per_seed.values()] for k in keys}
    spread = [f"{np.mean(v):+.3f} ± {np.std(v, ddof=1) if len(v) > 1 else float('nan'):.3f}" for v in deltas.values()]
    lines.append("| mean ± std | " + " | ".join(spread) + " |")
    return "\n".join(lines) + "\n"


def write_seeds_report(root: Path, work_dirs: dict[int, Path]) -> Path:
    """``ROOT/report.md`` of ``sa2va-rl demo-controls --video``: the seed table (each seed's own report is in its
    work dir); returns its path."""
    report = Path(root) / "report.md"
    lines = ["# Sa2VA-RL video demo over seeds", "",
             "Paired differences GRPO − start model on the held-out clips (95 % bootstrap CI per seed), and their "
             "mean ± standard deviation over the seeds; each seed's report: `seed<k>/report.md`.", "",
             seed_table(work_dirs)]
    report.write_text("\n".join(lines), encoding="utf-8")
    print(lines[-1])
    print(f"report: {report}")
    return report
