"""evaluation/report.py, plots.py, results.py and `sa2va-rl report` (cli/report.py) on synthetic runs of a shapes split.

Two systems are faked from the ground truth (no model): ``before`` predicts the region shifted by 6 px and a
half-right caption; ``after`` shifts by 1 px and gets the caption right. The report must show both, a paired
difference whose CI excludes 0, and readable PNGs.
"""
import json
import os

import numpy as np
import pytest
from PIL import Image

from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.evaluation.metrics import summarize
from projects.llava_sam2.rl_train.evaluation.plots import plot_curves, read_scalars
from projects.llava_sam2.rl_train.evaluation.records import EvalRecord, MaskStats
from projects.llava_sam2.rl_train.evaluation.report import write_report
from projects.llava_sam2.rl_train.evaluation.results import load_run, save_run
from projects.llava_sam2.rl_train.evaluation.tasks import TaskResult

SPEC = {"kind": "shapes", "split": "val", "seed": 3, "num_samples": 24, "image_size": 96}


def _shifted(mask: np.ndarray, pixels: int) -> np.ndarray:
    out = np.zeros_like(mask)
    out[:, pixels:] = mask[:, :mask.shape[1] - pixels]
    return out


def fake_run(out_dir, name: str, shift: int, caption_words: int, seed: int = 0) -> str:
    """A saved run of all four tasks whose masks are the GT shifted by ``shift`` px and whose captions keep
    the first ``caption_words`` words of the GT caption (plus noise words)."""
    rng = np.random.default_rng(seed)
    world = ShapesWorld(SPEC["split"], SPEC["num_samples"], SPEC["seed"], image_size=SPEC["image_size"])
    results = {task: TaskResult(task, []) for task in ("res", "caption", "cycle_iou", "cycle_caption")}
    for sample in world:
        pred = _shifted(sample.gt_mask, shift + int(rng.integers(0, 2)))
        no_seg = rng.random() < 0.1
        stats = MaskStats.from_masks(None if no_seg else pred, sample.gt_mask, 0 if no_seg else 1, keep_rle=True,
                                     sample_id=sample.sample_id)
        words = sample.captions[0].split()
        caption = " ".join(words[:caption_words] + ["blob"] * (len(words) - caption_words))
        meteor = caption_words / len(words) * (0.8 + 0.2 * rng.random())
        refs = list(sample.captions)
        results["res"].records.append(EvalRecord("res", sample.sample_id, stats.iou, text_in=sample.expressions[0],
                                                 answer_a="It is [SEG].", mask=stats))
        results["caption"].records.append(EvalRecord("caption", sample.sample_id, meteor, answer_a=caption,
                                                     caption=caption, references=refs, region_tokens=3))
        results["cycle_iou"].records.append(EvalRecord("cycle_iou", sample.sample_id, stats.iou, answer_a=caption,
                                                       answer_b="Sure, [SEG].", caption=caption, mask=stats))
        results["cycle_caption"].records.append(EvalRecord(
            "cycle_caption", sample.sample_id, meteor, text_in=sample.captions[0], answer_a="It is [SEG].",
            answer_b=caption, caption=caption, references=refs, mask=stats))
    for result in results.values():
        result.metrics = summarize(result.task, result.records, n_resamples=300)
    run_dir = str(out_dir / name)
    save_run(run_dir, results, {"system": name, "model": {"source": f"synthetic shift {shift}"}, "dataset": SPEC,
                                "config": {"max_new_tokens": 64, "caption_cleaning": "sa2va"}})
    return run_dir


def fake_scalars(work_dir) -> str:
    """MMEngine LocalVisBackend layout: <work_dir>/<timestamp>/vis_data/scalars.json, JSON lines."""
    path = work_dir / "20250101_000000" / "vis_data" / "scalars.json"
    path.parent.mkdir(parents=True)
    rng = np.random.default_rng(0)
    with open(path, "w") as handle:
        for step in range(1, 61):
            caption_reward = 0.2 + 0.5 * step / 60 + 0.05 * rng.standard_normal()
            handle.write(json.dumps({"lr": 1e-5, "mask_to_caption/reward_mean": caption_reward,
                                     "train/caption_to_mask/reward_mean": 0.1 + 0.3 * step / 60,
                                     "step": step}) + "\n")
        handle.write(json.dumps({"val/accuracy": 0.5, "step": 60}) + "\n")  # a line without the keys
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return root, {"before": fake_run(root, "before", 6, 2), "after": fake_run(root, "after", 1, 6, seed=1)}


def _is_png(path) -> tuple[int, int]:
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


def test_save_and_load_run_round_trip(runs):
    _, dirs = runs
    run = load_run(dirs["after"])
    assert run.meta["dataset"] == SPEC and sorted(run.results) == ["caption", "cycle_caption", "cycle_iou", "res"]
    records = run.records("res")
    assert len(records) == 24 and records[0].mask.rle is not None
    again = summarize("res", records, n_resamples=300)
    assert again["cIoU"] == run.results["res"].metrics["cIoU"]  # same records + seed -> same CI
    with pytest.raises(ValueError, match="no task 'nope'"):
        run.records("nope")


def test_report_tables_differences_and_pngs(runs, tmp_path):
    root, dirs = runs
    scalars = fake_scalars(root / "work_dir")
    path = write_report(str(tmp_path), dirs, baseline="before", scalars=str(root / "work_dir"), num_examples=3,
                        n_resamples=300)
    text = open(path, encoding="utf-8").read()
    assert "| system | n | cIoU | gIoU |" in text and "| system | n | METEOR_nltk |" in text
    after_res = load_run(dirs["after"]).results["res"].metrics["cIoU"]
    assert f"| after | 24 | {after_res.format()} |" in text
    # the 1-px system beats the 6-px one on cIoU with a paired CI that excludes 0
    diff_row = next(line for line in text.splitlines() if line.startswith("| after |") and "✅" in line)
    delta = float(diff_row.split("|")[2].split()[0])
    assert delta > 0.2
    for name in ("metrics.png", "curves.png", "examples_res.png", "examples_caption.png", "examples_cycle_iou.png",
                 "examples_cycle_caption.png"):
        assert f"({name})" in text
        width, height = _is_png(tmp_path / name)
        assert width > 300 and height > 200
    assert read_scalars(scalars)[0]["caption_to_mask/reward_mean"] == pytest.approx(0.1 + 0.3 / 60)  # no 'train/'


def test_curves_name_missing_keys(runs, tmp_path):
    root, _ = runs
    scalars = fake_scalars(tmp_path / "wd")
    with pytest.raises(ValueError, match=r"no values for scalar keys \['loop3/reward'\].*mask_to_caption/reward"):
        plot_curves(scalars, str(tmp_path / "c.png"), {"loop 3": "loop3/reward"})
    with pytest.raises(ValueError, match="no <timestamp>/vis_data/scalars.json"):
        plot_curves(str(tmp_path / "empty"), str(tmp_path / "c.png"))


def test_default_curves_plot_the_loops_the_run_trained(tmp_path):
    """A run with loop 2 switched off logs no caption_to_mask rewards (demo-controls' loop1_only, or `sa2va-rl demo
    --rl-options ...caption_to_mask_weight=0`): its report plots loop 1 instead of failing."""
    path = tmp_path / "wd" / "20250101_000000" / "vis_data" / "scalars.json"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps({"mask_to_caption/reward_mean": 0.1 * step, "step": step}) + "\n"
                            for step in range(1, 11)))
    png = plot_curves(str(tmp_path / "wd"), str(tmp_path / "c.png"))
    assert os.path.getsize(png) > 0
    with pytest.raises(ValueError, match=r"no values for scalar keys \['caption_to_mask/reward_mean'\]"):
        plot_curves(str(tmp_path / "wd"), str(tmp_path / "c.png"), {"loop 2": "caption_to_mask/reward_mean"})


def test_make_report_tool(runs, tmp_path, capsys):
    import projects.llava_sam2.rl_train.cli.report as make_report

    _, dirs = runs
    make_report.main(["--run", f"a={dirs['before']}", "--run", f"b={dirs['after']}", "--out", str(tmp_path),
                      "--examples", "0", "--n-resamples", "200"])
    assert "wrote" in capsys.readouterr().out
    text = (tmp_path / "report.md").read_text()
    assert "Paired differences vs `a`" in text and not (tmp_path / "examples_res.png").exists()
    with pytest.raises(SystemExit, match="expected NAME=VALUE"):
        make_report.main(["--run", dirs["before"], "--out", str(tmp_path)])


def _caption_run(name: str, scores) -> "Run":
    from projects.llava_sam2.rl_train.evaluation.results import Run

    records = [EvalRecord("caption", f"s#{i}", float(s), answer_a="a thing", caption="a thing",
                          references=["a thing"]) for i, s in enumerate(scores)]
    result = TaskResult("caption", records)
    result.metrics = summarize("caption", records, n_resamples=300)
    return Run(name, {}, {"caption": result})


@pytest.mark.parametrize("moved, delta, mark", [
    (4, 0.05, ""),     # 4 of 200 samples up by 0.05: +0.001 [0.000, 0.002]: the printed CI touches 0 -> no mark
    (20, 0.002, ""),   # 20 of 200 up by 0.002: 0.000 [0.000, 0.000], CI > 0 unrounded -> no mark
    (40, 0.5, " ✅"),  # +0.100, CI far from 0
    (40, -0.5, " ⚠️"),  # a loss
])
def test_significance_mark_needs_a_printed_ci_off_zero_and_a_minimum_effect(moved, delta, mark):
    from projects.llava_sam2.rl_train.evaluation.report import differences_table

    base = [0.3] * 200
    other = [s + (delta if i < moved else 0.0) for i, s in enumerate(base)]
    table = differences_table("caption", {"before": _caption_run("before", base), "after": _caption_run("after", other)},
                              "before", n_resamples=300)
    row = next(line for line in table.splitlines() if line.startswith("| after |"))
    cell = row.split("|")[2].strip()
    assert cell.endswith(mark.strip()) and (mark or ("✅" not in cell and "⚠️" not in cell)), cell


def test_is_marked_rule():
    from projects.llava_sam2.rl_train.evaluation.bootstrap import Estimate
    from projects.llava_sam2.rl_train.evaluation.report import is_marked

    assert not is_marked(Estimate(0.001, 0.0002, 0.0014, 200))   # displays +0.001 [0.000, 0.001]
    assert not is_marked(Estimate(0.0003, 0.0001, 0.0004, 200))  # displays 0.000 [0.000, 0.000]
    assert not is_marked(Estimate(0.004, 0.002, 0.006, 200))     # CI off zero, but |Δ| < 0.005
    assert not is_marked(Estimate(0.2, -0.01, 0.4, 200))         # CI includes 0
    assert is_marked(Estimate(0.02, 0.006, 0.034, 200)) and is_marked(Estimate(-0.02, -0.03, -0.01, 200))


def test_example_panels_keep_the_score_line_under_a_long_answer(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    from projects.llava_sam2.rl_train.evaluation.plots import plot_examples

    sample = next(iter(ShapesWorld(SPEC["split"], 1, SPEC["seed"], image_size=64)))
    stats = MaskStats.from_masks(sample.gt_mask, sample.gt_mask, 1, keep_rle=True, sample_id=sample.sample_id)
    long_caption = " ".join(["a very long rambling caption"] * 30)
    records = {"sys": {sample.sample_id: EvalRecord("cycle_iou", sample.sample_id, 0.5, answer_a=long_caption,
                                                    answer_b="Sure, [SEG].", caption=long_caption, mask=stats)}}
    labels = []
    original = Axes.set_xlabel
    monkeypatch.setattr(Axes, "set_xlabel", lambda self, text, *a, **k: (labels.append(text), original(self, text, *a, **k))[1])
    plot_examples("cycle_iou", [sample], records, str(tmp_path / "ex.png"))
    lines = labels[-1].split("\n")  # the system's panel
    assert lines[-1] == "IoU 0.50" and len(lines) <= 6 and lines[-2].endswith("…"), lines
    assert all(len(line) <= 34 for line in lines)


def test_example_panels_hide_stop_tokens_and_label_a_missing_mask(tmp_path, monkeypatch):
    """The demo's PNGs printed raw `<|im_end|>` in answers and drew an empty prediction as nothing at all."""
    import numpy as np
    from matplotlib.axes import Axes

    from projects.llava_sam2.rl_train.evaluation.plots import plot_examples

    sample = next(iter(ShapesWorld(SPEC["split"], 1, SPEC["seed"], image_size=64)))
    sid = sample.sample_id
    empty = MaskStats.from_masks(np.zeros_like(sample.gt_mask), sample.gt_mask, 1, keep_rle=True, sample_id=sid)
    no_seg = MaskStats.from_masks(None, sample.gt_mask, 0, keep_rle=True, sample_id=sid)
    found = MaskStats.from_masks(sample.gt_mask, sample.gt_mask, 1, keep_rle=True, sample_id=sid)
    records = {name: {sid: EvalRecord("res", sid, 0.0, text_in="the red box", answer_a=f"Sure, {answer}<|im_end|>",
                                      mask=stats)}
               for name, answer, stats in (("empty", "[SEG].", empty), ("no_seg", "it is a box.", no_seg),
                                           ("found", "[SEG].", found))}
    labels, texts = [], []
    set_xlabel, text = Axes.set_xlabel, Axes.text
    monkeypatch.setattr(Axes, "set_xlabel",
                        lambda self, s, *a, **k: (labels.append(s), set_xlabel(self, s, *a, **k))[1])
    monkeypatch.setattr(Axes, "text",
                        lambda self, x, y, s, *a, **k: (texts.append(s), text(self, x, y, s, *a, **k))[1])
    plot_examples("res", [sample], records, str(tmp_path / "ex.png"))
    assert not any("<|im_end|>" in label for label in labels)
    assert labels[1].startswith("Sure, [SEG].") and labels[2].startswith("Sure, it is a box.")
    assert texts == ["no mask", "no mask"]  # the empty and the missing prediction; the found mask is drawn
