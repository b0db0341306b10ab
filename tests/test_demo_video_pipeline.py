"""The whole video demo (`sa2va-rl demo --video`) at tiny sizes: every stage runs through the project's CLI, GRPO
trains on the unpaired SA-V / MeViS files and exports, both systems are evaluated on the same held-out clips, and the
report holds the held-out table with paired CIs, the reward curves and the before/after masklet strips. It runs in
`make demo` (marker `demo`, ~3 minutes on 2 cores), not in `make test`; the pieces are tests/test_demo_video.py."""
from __future__ import annotations

import pytest

from projects.llava_sam2.rl_train.demo.pipeline import DemoSettings, run_demo
from projects.llava_sam2.rl_train.evaluation.results import load_run

pytestmark = pytest.mark.demo


@pytest.fixture(scope="module")
def video_demo(tmp_path_factory):
    settings = DemoSettings(tmp_path_factory.mktemp("video_demo"), video=True, train_samples=8, val_samples=4,
                            num_frames=4, video_mllm_frames=2, rl_iters=3, eval_split="val", num_examples=2,
                            image_size=64)
    return settings, run_demo(settings)


def test_every_stage_ran_through_the_cli_on_the_video_files(video_demo):
    s, records = video_demo
    assert set(records) == {"data", "sft", "rl", "eval_base", "eval_rl", "text_rl", "report"}
    train, export = records["rl"]["commands"]
    assert "-m projects.llava_sam2.rl_train.cli train " in train["command"]
    assert s.rl_config.endswith("grpo_shapes_video_cpu.py") and s.rl_config in train["command"]
    assert f"regions.annotation_root={s.path('data/rl_regions/sav_train')}" in train["command"]
    assert f"texts.expression_file={s.path('data/rl_texts/meta_expressions.json')}" in train["command"]
    assert (s.path("rl/hf/config.json")).is_file()
    for key in ("eval_base", "eval_rl"):
        (command,) = records[key]["commands"]
        assert " evaluate " in command["command"] and "--dataset mevis" in command["command"]
    assert records["text_rl"]["skipped"]  # the image world's scene measures do not run on video


def test_both_systems_are_scored_on_the_same_held_out_clips_with_every_frame(video_demo):
    s, _ = video_demo
    base, rl = load_run(str(s.path("eval/base"))), load_run(str(s.path("eval/rl")))
    for task in ("video_res", "video_cycle_jf", "video_cycle_caption"):
        ids = [r.sample_id for r in base.records(task)]
        assert len(ids) == 4 and ids == [r.sample_id for r in rl.records(task)]
        assert all(len(r.frame_j) == 4 for r in rl.records(task))
    assert rl.meta["model"]["source"] == f"checkpoint {s.path('rl/hf')}"
    assert base.meta["model"]["source"] == f"checkpoint {s.start_checkpoint}"


def test_report_has_the_held_out_table_curves_and_strips(video_demo):
    s, records = video_demo
    report = s.path("report.md").read_text()
    for label in ("video Loop-1 cycle J&F", "video Loop-2 cycle METEOR", "video referring J&F vs GT",
                  "video referring J&F, propagated"):
        row = next(line for line in report.splitlines() if line.startswith(f"| {label}"))
        assert row.count("[") == 3, f"{label}: base, GRPO and the paired Δ each need a CI: {row}"
    assert s.path("reward_curves.png").stat().st_size > 0
    strips = sorted(p.name for p in s.path("examples").glob("video_cycle_*.png"))
    assert strips == ["video_cycle_0_base.png", "video_cycle_0_rl.png", "video_cycle_1_base.png",
                      "video_cycle_1_rl.png"]
    assert all(f"examples/{name}" in report for name in strips)
    assert set(records["report"]["outputs"]["metrics"]) >= {"video_cycle_jf/cycle_JF",
                                                            "video_cycle_caption/cycle_METEOR_nltk"}
