"""The demo pipeline, shortened (issue #6's learning regression test).

The demo's own stages (demo/pipeline.py) run as subprocesses, as ``make demo`` runs them: the shapes world written as
COCO files -> SFT with the demo SFT config (xtuner's TrainLoop) -> export -> GRPO with the demo GRPO config from that
export -> export. The RL phase must raise the mean training reward of BOTH loops over its iterations on a fixed seed;
the rewards are read from the run's MMEngine ``scalars.json`` (what LoggerHook wrote), not recomputed.

Shortened settings: 96 training scenes, 150 SFT iterations, then 30 GRPO iterations (4 generations per prompt) whose
prompts are the first 8 training scenes, all in every batch: each point of the reward curve scores the same prompts,
so a rising mean is learning, not easier batches. Measured on this seed (docs/demo.md): loop 1 0.211 -> 0.256,
loop 2 0.490 -> 0.497 (first / last 7 iterations).
"""
from __future__ import annotations

import json

import pytest

from projects.llava_sam2.rl_train.demo.pipeline import DemoSettings, run_demo
from projects.llava_sam2.rl_train.demo.summary import REWARD_KEYS, reward_trend

SFT_ITERS, RL_ITERS, WINDOW = 150, 30, 7


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    settings = DemoSettings(
        tmp_path_factory.mktemp("demo"), seed=0, train_samples=96, val_samples=8, rl_train_samples=8,
        sft_iters=SFT_ITERS, rl_iters=RL_ITERS,
        rl_options=["train_dataloader.batch_size=8", "train_cfg.algorithm.config.num_generations=4",
                    "optim_wrapper.optimizer.lr=2e-3"])
    records = run_demo(settings, only={"data", "sft", "rl"})
    return settings, records


def test_demo_stages_ran_through_the_project_cli(demo_run):
    settings, records = demo_run
    assert set(records) == {"data", "sft", "rl"}
    for stage in ("sft", "rl"):
        train, export = records[stage]["commands"]
        assert "-m projects.llava_sam2.rl_train.cli train " in train["command"] and train["cpu_s"] > 0
        assert (settings.path(stage, "hf", "config.json")).is_file(), f"{stage}: no exported checkpoint"
    # the RL run started from the SFT export
    assert f"model.pretrained_path={settings.path('sft/hf')}" in records["rl"]["commands"][0]["command"]
    assert len(json.loads(settings.path("data/train/annotations.json").read_text())["annotations"]) == 96
    rl_prompts = json.loads(settings.path("data/rl_train/annotations.json").read_text())["annotations"]
    assert len(rl_prompts) == 8
    assert f"train_dataloader.dataset.ann_file={settings.path('data/rl_train/annotations.json')}" in \
        records["rl"]["commands"][0]["command"]


def test_rl_raises_the_mean_training_reward_of_both_loops(demo_run):
    settings, _ = demo_run
    trend = reward_trend(settings.path("rl"), window=WINDOW)
    for key in REWARD_KEYS:
        assert trend[key]["n"] == RL_ITERS, f"{key}: {trend[key]['n']} logged iterations, expected {RL_ITERS}"
        assert trend[key]["last"] > trend[key]["first"], (
            f"{key}: mean over the last {WINDOW} iterations {trend[key]['last']:.4f} <= first {WINDOW} "
            f"{trend[key]['first']:.4f}; the RL phase did not raise this loop's training reward")
