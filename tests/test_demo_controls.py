"""demo/controls.py and demo/summary.py without training: which runs the controls make, and the goal checks."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from projects.llava_sam2.rl_train.demo.controls import (
    ALGO, KL_BETA, MASK_VARIANTS, algorithm_config, control_specs, mask_variant_name)
from projects.llava_sam2.rl_train.demo.pipeline import REPO_ROOT, DemoSettings, subprocess_env
from projects.llava_sam2.rl_train.demo.summary import Row, goal_checks
from projects.llava_sam2.rl_train.evaluation.bootstrap import Estimate
from projects.llava_sam2.rl_train.grpo.config import GRPOConfig


def test_demo_starts_from_the_committed_pretrained_model_without_sft(tmp_path):
    s = DemoSettings(tmp_path)
    assert Path(s.start_checkpoint, "config.json").is_file() and s.sft_iters == 0
    assert s.rl_start == s.start_checkpoint and s.systems == {"base": "pretrained", "rl": "pretrained + GRPO"}
    # the base evaluation does not depend on the training seed when nothing is trained before GRPO
    assert DemoSettings(tmp_path, seed=1).fingerprint("eval_base") == s.fingerprint("eval_base")
    assert DemoSettings(tmp_path, seed=1).fingerprint("rl") != s.fingerprint("rl")
    # ... but on the data: another held-out split, domain or data seed redoes the evaluations and GRPO
    for other in (dict(eval_split="val"), dict(target_shift=2.0), dict(data_seed=1), dict(rl_data="paired")):
        assert DemoSettings(tmp_path, **other).fingerprint("eval_base") != s.fingerprint("eval_base"), other
        assert DemoSettings(tmp_path, **other).fingerprint("rl") != s.fingerprint("rl"), other
    sft = DemoSettings(tmp_path, sft_iters=50)
    assert sft.rl_start == str(tmp_path / "sft/hf") and sft.systems["rl"] == "pretrained + SFT + GRPO"
    assert DemoSettings(tmp_path, seed=1, sft_iters=50).fingerprint("eval_base") != sft.fingerprint("eval_base")


def test_control_specs_cover_loops_mask_variants_kl_and_sft(tmp_path):
    s = DemoSettings(tmp_path)
    config = algorithm_config(s)
    default = mask_variant_name(config)
    specs = control_specs(s, sft_iters=40)
    expected = {"sft_more", "source_sft", "loop1_only", "loop2_only", "kl_off" if config["beta"] > 0 else "kl_on"}
    expected |= {f"mask_{name}" for name in MASK_VARIANTS if name != default}
    assert set(specs) == expected
    # the demo runs the project's default mask action; the earlier one (pooled Bernoulli, per-cell ratio) is a control
    defaults = GRPOConfig()
    assert default == "region" and all(config[k] == getattr(defaults, k) for k in MASK_VARIANTS["region"])
    assert {f"{ALGO}.mask_policy=bernoulli", f"{ALGO}.mask_importance_sampling_level=token"} <= set(
        specs["mask_bernoulli"][1])
    assert f"{ALGO}.caption_to_mask_weight=0.0" in specs["loop1_only"][1]
    assert f"{ALGO}.mask_to_caption_weight=0.0" in specs["loop2_only"][1]
    kl = "kl_off" if config["beta"] > 0 else "kl_on"
    assert specs[kl][1][-1] == f"{ALGO}.beta={0.0 if kl == 'kl_off' else KL_BETA}"
    sft_config, sft_options = specs["sft_more"]
    assert sft_config == s.sft_config and "train_cfg.max_iters=40" in sft_options
    assert f"model.pretrained_path={s.start_checkpoint}" in sft_options
    # the oracle trains on the demo's paired (target) scenes, source-SFT on source scenes, for the same iterations
    assert f"train_dataloader.dataset.region_dataset.ann_file={s.path('data/train/annotations.json')}" in sft_options
    source_config, source_options = specs["source_sft"]
    assert source_config == s.sft_config and "train_cfg.max_iters=40" in source_options
    assert f"train_dataloader.dataset.region_dataset.ann_file={s.path('data/source_train/annotations.json')}" in \
        source_options
    assert "source_sft" not in control_specs(DemoSettings(tmp_path, target_shift=0.0), sft_iters=40)
    for name, (config_path, options) in specs.items():  # every GRPO control starts where the demo's GRPO starts
        if name not in ("sft_more", "source_sft"):
            assert config_path == s.rl_config and f"model.pretrained_path={s.rl_start}" in options


def test_demo_subprocesses_keep_the_callers_pythonpath(monkeypatch):
    # an environment installed with `pip --target DIR` lives on PYTHONPATH (the lent GPU machines): the demo's
    # training and evaluation children must still see it, after the checkout
    monkeypatch.setenv("PYTHONPATH", "/opt/site")
    assert subprocess_env()["PYTHONPATH"].split(os.pathsep) == [str(REPO_ROOT), "/opt/site"]
    monkeypatch.delenv("PYTHONPATH")
    assert subprocess_env()["PYTHONPATH"] == str(REPO_ROOT)


def test_demo_loop1_reward_keeps_the_caption_true(tmp_path):
    # the paired demo pays loop 1 for the cycle IoU and for METEOR against the GT caption (docs/demo.md, "Loop 1's
    # reward"); the cycle-only control config drops the second term, and so does the unpaired demo (no caption)
    from mmengine.config import Config

    paired = DemoSettings(tmp_path, rl_data="paired", target_shift=0.0).rl_config
    demo = Config.fromfile(paired).train_cfg.algorithm.rewards.mask_to_caption
    assert [(r["type"].__name__, r["weight"]) for r in demo] == [("IoUReward", 1.0), ("MeteorReward", 1.0)]
    unpaired = Config.fromfile(DemoSettings(tmp_path).rl_config).train_cfg.algorithm
    assert [r["type"].__name__ for r in unpaired.rewards.mask_to_caption] == ["IoUReward"]
    # loop 1's dense mask loss needs no caption label: the unpaired demo's default (chosen on validation seeds)
    assert unpaired.config.mask_to_caption_dense_weight == 1.0
    control = Path(paired).with_name("grpo_shapes_cycle_only_cpu.py")
    only = Config.fromfile(str(control)).train_cfg.algorithm.rewards.mask_to_caption
    assert [r["type"].__name__ for r in only] == ["IoUReward"]


def test_controls_refuse_zero_jobs(capsys):
    from projects.llava_sam2.rl_train.demo.controls import main

    with pytest.raises(SystemExit):
        main(["--jobs", "0", "--controls"])
    assert "--jobs" in capsys.readouterr().err


def test_rl_options_reach_the_algorithm_config(tmp_path):
    s = DemoSettings(tmp_path, rl_options=[f"{ALGO}.beta=0.5", f"{ALGO}.mask_policy=multimask"])
    config = algorithm_config(s)
    assert config["beta"] == 0.5 and mask_variant_name(config) == "multimask"
    assert "mask_multimask" not in control_specs(s) and "kl_off" in control_specs(s)


def _row(task, metric, guarded, base, rl, diff):
    return Row(task, metric, metric, guarded, Estimate(*base, 200, 0.95, 1000), Estimate(*rl, 200, 0.95, 1000),
               Estimate(*diff, 200, 0.95, 1000))


class _Change:
    def __init__(self, gap):
        self.gap, self.num_scenes = Estimate(*gap, 200, 0.95, 1000), 200


@pytest.mark.parametrize("diff, gap, passed", [
    ((0.12, 0.05, 0.19), (0.0, -0.01, 0.01), {"cycle_gain": True, "no_regression": True, "text_gap": True}),
    ((0.12, -0.01, 0.25), (-0.03, -0.05, -0.01), {"cycle_gain": False, "no_regression": True, "text_gap": False}),
    # a gain below the old +0.10 bar counts when its CI is above 0 (the share of the oracle's gain is the controls')
    ((0.06, 0.04, 0.08), (0.01, -0.01, 0.03), {"cycle_gain": True, "no_regression": True, "text_gap": True}),
])
def test_goal_checks_use_the_paired_ci(diff, gap, passed):
    rows = [_row("cycle_iou", "cycle_IoU", False, (0.5, 0.45, 0.55), (0.5 + diff[0], 0.5, 0.7), diff),
            _row("caption", "METEOR_nltk", True, (0.69, 0.66, 0.72), (0.68, 0.65, 0.71), (-0.01, -0.03, 0.004))]
    checks = goal_checks(rows, _Change(gap))
    assert {k: c["passed"] for k, c in checks.items()} == passed
    regressed = [_row("caption", "METEOR_nltk", True, (0.69, 0.66, 0.72), (0.6, 0.57, 0.63), (-0.09, -0.12, -0.06))]
    assert not goal_checks(regressed)["no_regression"]["passed"] and "text_gap" not in goal_checks(regressed)


def test_sft_more_length_comes_from_every_probe_iteration(tmp_path, monkeypatch):
    # the SFT config logs every 10th iteration: a 20-iteration probe left no timed iteration after the warm-up and
    # the control divided by zero; the probe now logs each iteration
    import json

    from projects.llava_sam2.rl_train.demo import controls

    s = DemoSettings(tmp_path)
    rl_scalars = s.path("rl", "20260101_000000", "vis_data", "scalars.json")
    rl_scalars.parent.mkdir(parents=True)
    rl_scalars.write_text("".join(json.dumps({"time": 2.0, "iter": i}) + "\n" for i in range(1, 61)))

    def fake_run_jobs(jobs, env=None):  # the probe's training, at 0.5 s an iteration, logged as its options say
        argv = jobs[0].commands[0].argv
        options = argv[argv.index("--cfg-options") + 1:]
        interval = next((int(o.split("=")[1]) for o in options if o.startswith("default_hooks.logger.interval=")), 10)
        out = s.path("controls", "sft_probe", "20260101_000001", "vis_data", "scalars.json")
        out.parent.mkdir(parents=True)
        out.write_text("".join(json.dumps({"time": 0.5, "iter": i}) + "\n"
                               for i in range(interval, controls.SFT_PROBE_ITERS + 1, interval)))
        jobs[0].seconds = [{"wall_s": 1.0, "cpu_s": 1.0}]

    monkeypatch.setattr(controls, "run_jobs", fake_run_jobs)
    assert controls.sft_more_iters(s) == 240  # 60 GRPO iterations x 2 s / 0.5 s per SFT iteration


def test_summary_comments_when_training_reward_and_held_out_metric_disagree():
    """The demo's loop-1 training reward fell while its held-out cycle IoU rose, and the report said nothing."""
    from projects.llava_sam2.rl_train.demo.summary import summary_markdown, summary_terminal, trend_disagreements

    rows = [_row("cycle_iou", "cycle_IoU", False, (0.5, 0.45, 0.55), (0.6, 0.55, 0.65), (0.1, 0.05, 0.15)),
            _row("cycle_caption", "cycle_METEOR_nltk", False, (0.3, 0.25, 0.35), (0.31, 0.26, 0.36),
                 (0.01, -0.02, 0.04))]
    trend = {"mask_to_caption/reward_mean": {"first": 0.40, "last": 0.30, "window": 2, "n": 8},
             "caption_to_mask/reward_mean": {"first": 0.20, "last": 0.10, "window": 2, "n": 8}}
    lines = trend_disagreements(rows, trend)
    # loop 1 disagrees (reward down, held-out up beyond its CI); loop 2's held-out change is within its CI
    assert len(lines) == 1 and "`mask_to_caption/reward_mean` fell" in lines[0] and "cycle_IoU rose" in lines[0]
    assert lines[0] in summary_markdown(rows, {}, trend, 0.0, {}, ["sft", "rl"], {})
    assert lines[0] in summary_terminal(rows, {}, trend, ["sft", "rl"])
    agreeing = {**trend, "mask_to_caption/reward_mean": {"first": 0.30, "last": 0.40, "window": 2, "n": 8}}
    assert trend_disagreements(rows, agreeing) == []


def test_report_only_runs_nothing_and_needs_the_evaluations(tmp_path, capsys, monkeypatch):
    from projects.llava_sam2.rl_train.demo import controls

    monkeypatch.setattr(controls, "run_demo", lambda *a, **k: pytest.fail("--report-only must not run the demo"))
    code = controls.main(["--work-dir", str(tmp_path), "--seeds", "10", "--controls", "sft_more", "--report-only"])
    assert code == 1 and "run the seeds first" in capsys.readouterr().err
