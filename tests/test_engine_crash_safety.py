"""Crash-safe checkpoints, killed by a writer that dies half-way through a file: ``kill -9`` in
the middle of a save, in one process or in two gloo ranks, leaves a complete checkpoint to resume from, and the
resumed run logs what the uninterrupted run logged. The kills here patch the writers every checkpoint goes
through, so they hit MMEngine's CheckpointHook the same way (test_engine_fault_points.py kills between the phases
of AtomicCheckpointHook's save). Toy algorithm in forked children (tests/fault_tools.py): 6 iterations, a
checkpoint every 2, one kept.
"""
from __future__ import annotations

import pytest
import torch

from engine_toy import write_toy_config
from fault_tools import CRASH_OPTIONS, KILLED, ReferenceRuns, resume_and_compare, run_forked, train_toy_killed_in_write
from grpo_tiny import one_thread

_one_thread = pytest.fixture(autouse=True)(one_thread)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return ReferenceRuns(tmp_path_factory)


def test_kill_half_way_through_writing_the_checkpoint_keeps_the_previous_one(tmp_path, reference):
    """MMEngine's hook deleted iter_2 before writing iter_4, and the kill left iter_4.pth cut in half: nothing to
    resume from. Here iter_4 never gets its final name and iter_2 stays."""
    codes = run_forked(train_toy_killed_in_write, work_dir=str(tmp_path), tag="killed", path_part="iter_4.pth",
                       **CRASH_OPTIONS)
    assert codes == [KILLED]
    assert (tmp_path / "iter_2.pth").is_file() and not (tmp_path / "iter_4.pth").exists()
    resume_and_compare(tmp_path, "iter_2.pth", reference())


def test_two_ranks_killed_before_the_rng_side_file_exists_resume_from_the_previous_checkpoint(tmp_path, reference):
    """Per-rank RNG states live in a side file. MMEngine moved last_checkpoint to iter_4 before that file existed,
    so auto-resume failed on the only checkpoint; here the checkpoint is committed only after its side files."""
    codes = run_forked(train_toy_killed_in_write, world=2, work_dir=str(tmp_path), tag="killed",
                       path_part="iter_4.pth.rng_state", **CRASH_OPTIONS)
    assert KILLED in codes
    resume_and_compare(tmp_path, "iter_2.pth", reference(world=2), world=2)


def test_train_py_resume_auto_picks_the_newest_complete_checkpoint(tmp_path):
    assert run_forked(train_toy_killed_in_write, work_dir=str(tmp_path), tag="killed", path_part="iter_4.pth",
                      **CRASH_OPTIONS) == [KILLED]
    from tools.train import main as train_main  # the launcher script, imported as a module of the tools package

    args = ["--work-dir", str(tmp_path), "--cfg-options", "default_hooks.checkpoint.interval=2",
            "default_hooks.checkpoint.max_keep_ckpts=1", "train_cfg.max_iters=3"]
    assert train_main([write_toy_config(tmp_path), *args, "--resume", "auto"]) == 0
    checkpoint = torch.load(tmp_path / "iter_3.pth", weights_only=False)
    assert checkpoint["meta"]["iter"] == 3 and checkpoint["message_hub"]["runtime_info"]["iter"] == 2
    assert checkpoint["ema_partner"]["num_updates"] == 3  # resumed after 2 updates, then one more


def test_rng_state_restores_from_a_checkpoint_loaded_to_another_device_or_dtype():
    """A one-process GPU run's resume loads the checkpoint dict to its GPU, so the saved generator states arrive as
    CUDA tensors, which torch.set_rng_state refuses ("RNG state must be a torch.ByteTensor"); they are restored as
    CPU byte tensors whatever the tensors' device and dtype."""
    from projects.llava_sam2.rl_train.engine.checkpointing import capture_rng_state, restore_rng_state

    torch.manual_seed(5)
    state = capture_rng_state()
    expected = torch.rand(3)
    moved = {**state, "torch": state["torch"].to(torch.int64)}  # what a map_location / dtype change leaves
    torch.manual_seed(6)
    restore_rng_state(moved)
    assert torch.equal(torch.rand(3), expected)
