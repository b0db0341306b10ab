"""Empty and short batches (issue #13 item 2): with ``on_bad_sample='skip'`` a batch can lose every sample; the loop
replaces it by the next batch (on every rank at once), counts it, never dies, and a resume continues exactly.
Toy algorithm (tests/engine_toy.py) whose ``encode`` rejects an empty batch as ``CycleGRPO.encode`` does.
"""
from __future__ import annotations

import pytest
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
    assert replaced >= 1 and drawn == 6 + replaced
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
    with pytest.raises(ValueError, match="prompt batches in a row were empty.*every sample was skipped as bad"):
        run_config(write_toy_config(tmp_path), tmp_path, **options)


def test_two_ranks_replace_an_empty_batch_together_and_resume_exactly(tmp_path):
    """An empty batch on one rank only: both ranks draw again (else the collectives of the step would not match)."""
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
