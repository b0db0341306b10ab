"""Empty and short batches: with ``on_bad_sample='skip'`` a batch can lose every
sample; the loop replaces it by the next batch of the same rank while the other ranks keep theirs, counts it over
ranks, never dies while some rank can still find a good sample, and a resume continues exactly. Toy algorithm
(tests/engine_toy.py) whose ``encode`` rejects an empty batch as ``CycleGRPO.encode`` does.
"""
from __future__ import annotations

import json

import pytest
import torch
from engine_toy import run_config, write_toy_config
from fault_tools import outputs, run_forked, train_toy
from grpo_tiny import one_thread

_one_thread = pytest.fixture(autouse=True)(one_thread)
SKIP_HOOKS = [dict(type="EMAPartnerHook"), dict(type="TrainStateHook"), dict(type="SkippedSampleHook")]


def bad_sample_options(bad=(1, 4, 6)) -> dict:
    """Batch size 1, prompts ``bad`` (3 of 8 by default) are bad samples: their batches come out empty."""
    return {"train_dataloader.batch_size": 1, "train_dataloader.dataset.bad": tuple(bad), "custom_hooks": SKIP_HOOKS}


def test_empty_batches_are_replaced_counted_and_resume_is_exact(tmp_path):
    runner, full = run_config(write_toy_config(tmp_path), tmp_path, **bad_sample_options())
    assert sorted(full.outputs) == [1, 2, 3, 4, 5, 6]  # six iterations trained, none lost to an empty batch
    replaced = sum(full.outputs[i]["data/empty_batches"] for i in full.outputs)
    drawn = runner.message_hub.get_info("grpo_batches_drawn")
    assert replaced >= 1 and drawn == [6 + replaced]  # per rank
    assert runner.message_hub.get_info("grpo_empty_batches") == replaced
    # every replaced batch's bad sample was counted (distinct ids)
    assert runner.message_hub.get_scalar("train/data/skipped_samples").current() >= 1

    resumed_runner, resumed = run_config(write_toy_config(tmp_path), tmp_path, resume_from=str(tmp_path / "iter_3.pth"),
                                         **bad_sample_options())
    assert sorted(resumed.outputs) == [4, 5, 6]
    for i in (4, 5, 6):
        assert resumed.outputs[i] == full.outputs[i], i
    assert resumed_runner.message_hub.get_info("grpo_batches_drawn") == drawn


def test_every_sample_bad_gives_a_clear_error(tmp_path):
    options = bad_sample_options(bad=range(8))
    with pytest.raises(ValueError, match="every prompt batch was empty on rank.*every sample was skipped as bad"):
        run_config(write_toy_config(tmp_path), tmp_path, **options)


def test_two_ranks_replace_empty_batches_each_and_resume_exactly(tmp_path):
    """An empty batch on one rank only: that rank draws again, the other keeps its batch; both ranks' draw counts are
    in the checkpoint, so the resumed ranks each skip their own."""
    options = {"train_cfg.max_iters": 4, "default_hooks.checkpoint.interval": 2, **bad_sample_options()}
    assert run_forked(train_toy, world=2, work_dir=str(tmp_path), tag="full", **options) == [0, 0]
    full = [outputs(tmp_path, "full", rank) for rank in (0, 1)]
    assert sum(full[0][i]["data/empty_batches"] for i in full[0]) >= 1
    assert full[0] == full[1]  # logged values are reduced over ranks
    assert run_forked(train_toy, world=2, work_dir=str(tmp_path), tag="resumed",
                      resume_from=str(tmp_path / "iter_2.pth"), **options) == [0, 0]
    resumed = outputs(tmp_path, "resumed")
    assert sorted(resumed) == [3, 4]
    for i in (3, 4):
        assert resumed[i] == full[0][i], i


def test_two_ranks_with_most_samples_bad_train_on_the_good_ones_and_count_over_ranks(tmp_path):
    """2 ranks, batch 1, 6 of 8 samples bad. Replacing a batch on every rank whenever one rank's
    was empty stopped this run ("every sample was skipped as bad") although one process trains on it; each rank now
    replaces its own. The replaced batches and the skipped samples are counted over both ranks."""
    options = {"train_cfg.max_iters": 4, "default_hooks.checkpoint.interval": 4,
               **bad_sample_options(bad=(0, 1, 2, 3, 5, 6))}
    codes = run_forked(train_toy, world=2, work_dir=str(tmp_path), tag="run",
                       hub_scalars=("train/data/skipped_samples",), **options)
    assert codes == [0, 0]
    logged = [outputs(tmp_path, "run", rank) for rank in (0, 1)]
    assert sorted(logged[0]) == [1, 2, 3, 4] and logged[0] == logged[1]
    drawn = torch.load(tmp_path / "iter_4.pth", weights_only=False)["message_hub"]["runtime_info"]["grpo_batches_drawn"]
    assert len(drawn) == 2 and drawn[0] != drawn[1]  # each rank drew until it had a good sample
    assert sum(logged[0][i]["data/empty_batches"] for i in logged[0]) == sum(drawn) - 2 * 4  # all but the 8 trained
    skipped = [json.loads((tmp_path / f"run.{rank}.hub.json").read_text())["train/data/skipped_samples"]
               for rank in (0, 1)]
    assert skipped == [6, 6]  # every bad sample, as distinct ids gathered from both ranks
