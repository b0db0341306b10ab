"""AtomicCheckpointHook killed between the phases of its save (``$SA2VA_RL_FAULT``, engine/faults.py), under
Runner and FlexibleRunner (side files, as DeepSpeed) and with two gloo ranks: the run resumes from the newest
complete checkpoint and logs what the uninterrupted run logged. Plus the pieces: finding a complete checkpoint,
``--resume auto``, the hook's settings. Toy algorithm in forked children (tests/fault_tools.py).
"""
from __future__ import annotations

import pytest
import torch

from engine_toy import run_config, write_toy_config
from fault_tools import CRASH_OPTIONS, KILLED, ReferenceRuns, resume_and_compare, run_forked, train_toy
from grpo_tiny import one_thread
from projects.llava_sam2.rl_train.engine.atomic_files import is_loadable, newest_complete_checkpoint
from projects.llava_sam2.rl_train.engine.faults import FAULT_ENV, FAULT_POINTS
from projects.llava_sam2.rl_train.engine.launch import resolve_resume

_one_thread = pytest.fixture(autouse=True)(one_thread)
# point killed at -> the checkpoint to resume from (last_checkpoint moves only after iter_4 is committed)
EXPECTED = {"checkpoint.written": "iter_2.pth", "checkpoint.side_files_written": "iter_2.pth",
            "checkpoint.committed": "iter_2.pth", "checkpoint.pointer_moved": "iter_4.pth"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return ReferenceRuns(tmp_path_factory)


@pytest.mark.parametrize("runner_type", ["Runner", "FlexibleRunner"])
@pytest.mark.parametrize("point", FAULT_POINTS)
def test_kill_at_each_save_phase_then_resume_matches_the_uninterrupted_run(tmp_path, reference, point, runner_type):
    codes = run_forked(train_toy, work_dir=str(tmp_path), tag="killed", runner_type=runner_type,
                       env={FAULT_ENV: f"{point}@4"}, **CRASH_OPTIONS)
    assert codes == [KILLED]
    assert (tmp_path / "iter_4.pth").exists() == (point in ("checkpoint.committed", "checkpoint.pointer_moved"))
    if runner_type == "FlexibleRunner":  # the committed checkpoint has its side files
        assert (tmp_path / "iter_2.pth.rng_state.pth").is_file() and (tmp_path / "iter_2.pth.ema_partner.pth").is_file()
    assert newest_complete_checkpoint(str(tmp_path)) == str(tmp_path / EXPECTED[point])
    resume_and_compare(tmp_path, EXPECTED[point], reference(runner_type), runner_type)


def test_a_kill_mid_write_leaves_an_unreadable_partial_file_only(tmp_path):
    assert run_forked(train_toy, work_dir=str(tmp_path), tag="killed", env={FAULT_ENV: "checkpoint.written@4:truncate"},
                      **CRASH_OPTIONS) == [KILLED]
    assert not is_loadable(str(tmp_path / "iter_4.pth.partial")) and is_loadable(str(tmp_path / "iter_2.pth"))
    assert newest_complete_checkpoint(str(tmp_path)) == str(tmp_path / "iter_2.pth")


def test_two_ranks_killed_after_the_commit_resume_from_the_committed_checkpoint(tmp_path, reference):
    codes = run_forked(train_toy, world=2, work_dir=str(tmp_path), tag="killed",
                       env={FAULT_ENV: "checkpoint.pointer_moved@4@0"}, **CRASH_OPTIONS)
    assert KILLED in codes
    resume_and_compare(tmp_path, "iter_4.pth", reference(world=2), world=2)


def test_newest_complete_checkpoint_skips_unreadable_files(tmp_path):
    good = {"w": torch.ones(3)}
    for step in (2, 4):
        torch.save(good, tmp_path / f"iter_{step}.pth")
    data = (tmp_path / "iter_4.pth").read_bytes()
    (tmp_path / "iter_6.pth").write_bytes(data[: len(data) // 2])  # truncated
    assert newest_complete_checkpoint(str(tmp_path)) == str(tmp_path / "iter_4.pth")
    (tmp_path / "last_checkpoint").write_text(str(tmp_path / "iter_2.pth"))  # the pointer's trajectory wins
    assert newest_complete_checkpoint(str(tmp_path)) == str(tmp_path / "iter_2.pth")
    (tmp_path / "iter_2.pth.rng_state.pth").write_bytes(b"garbage")  # a broken side file breaks its checkpoint
    assert newest_complete_checkpoint(str(tmp_path)) == str(tmp_path / "iter_4.pth")


def test_resume_auto_in_an_empty_work_dir_starts_from_scratch(tmp_path):
    lines = []
    argv = ["cfg.py", "--work-dir", str(tmp_path), "--resume", "auto", "--seed", "1"]
    assert resolve_resume(argv, log=lines.append) == ["cfg.py", "--work-dir", str(tmp_path), "--seed", "1"]
    assert "no complete checkpoint" in lines[0]
    assert resolve_resume(["cfg.py", "--resume=x.pth"]) == ["cfg.py", "--resume", "x.pth"]


def test_checkpoint_hook_rejects_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="by_epoch=True is not supported"):
        run_config(write_toy_config(tmp_path), tmp_path, **{"default_hooks.checkpoint.by_epoch": True})
    with pytest.raises(ValueError, match="max_keep_ckpts=0"):
        run_config(write_toy_config(tmp_path), tmp_path, **{"default_hooks.checkpoint.max_keep_ckpts": 0})


def test_side_files_need_the_atomic_checkpoint_hook(tmp_path):
    with pytest.raises(ValueError, match="AtomicCheckpointHook"):
        run_config(write_toy_config(tmp_path), tmp_path, runner_type="FlexibleRunner",
                   **{"default_hooks.checkpoint": dict(type="CheckpointHook", interval=3, by_epoch=False)})
