"""The shortened demo on same-domain paired data (the setting the both-loop margins were calibrated on): GRPO raises
both loops' training reward beyond their noise margins. Settings, margins and their calibration:
tests/test_demo_pipeline.py and tests/demo_short.py. It runs in `make demo` (marker `demo`), not in `make test`: the
default demo is the domain-adaptation one, which tests/test_demo_pipeline.py checks in `make test`."""
from __future__ import annotations

import json

import pytest

from demo_short import MARGINS, PROMPTS, RL_ITERS, WINDOW, short_demo
from projects.llava_sam2.rl_train.demo.summary import REWARD_KEYS, reward_trend

pytestmark = pytest.mark.demo


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    return short_demo(tmp_path_factory.mktemp("demo"))


def test_demo_stages_ran_through_the_project_cli_from_the_pretrained_model(demo_run):
    settings, records = demo_run
    assert set(records) == {"data", "sft", "rl"} and records["sft"]["outputs"]["skipped"]
    train, export = records["rl"]["commands"]
    assert "-m projects.llava_sam2.rl_train.cli train " in train["command"] and train["cpu_s"] > 0
    assert (settings.path("rl", "hf", "config.json")).is_file(), "rl: no exported checkpoint"
    assert f"model.pretrained_path={settings.start_checkpoint}" in train["command"]
    assert settings.start_checkpoint.endswith("assets/tiny_shapes_pretrained")
    annotations = settings.path("data/train/annotations.json")
    assert len(json.loads(annotations.read_text())["annotations"]) == PROMPTS
    assert f"train_dataloader.dataset.ann_file={annotations}" in train["command"]


def test_grpo_raises_both_loops_training_reward_beyond_noise(demo_run):
    settings, _ = demo_run
    trend = reward_trend(settings.path("rl"), window=WINDOW)
    for key in REWARD_KEYS:
        assert trend[key]["n"] == RL_ITERS, f"{key}: {trend[key]['n']} logged iterations, expected {RL_ITERS}"
        rise = trend[key]["last"] - trend[key]["first"]
        assert rise > MARGINS[key], (
            f"{key}: mean over the last {WINDOW} iterations {trend[key]['last']:.4f} - first {WINDOW} "
            f"{trend[key]['first']:.4f} = {rise:+.4f}, not above the noise margin {MARGINS[key]}; the GRPO run did "
            "not raise this loop's training reward")
