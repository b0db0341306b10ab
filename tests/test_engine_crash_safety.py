"""Crash-safe checkpoints (issue #13 item 3): ``kill -9`` at any point of a save, in one process or in two gloo
ranks, leaves a complete checkpoint to resume from, and the resumed run logs what the uninterrupted run logged.

Runs are the toy algorithm in forked children (tests/fault_tools.py): 6 iterations, a checkpoint every 2, one kept
(``max_keep_ckpts=1``, the setting where MMEngine's CheckpointHook deletes the only checkpoint before writing the
next). Kills come from ``$SA2VA_RL_FAULT`` (engine/faults.py) between the save phases, or from a patched writer
that dies half-way through a file.
"""
from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch

from engine_toy import run_config, write_toy_config
from fault_tools import KILLED, outputs, run_forked, train_toy, train_toy_killed_in_write
from grpo_tiny import one_thread
from projects.llava_sam2.rl_train.engine.atomic_files import checkpoint_steps, is_loadable, newest_complete_checkpoint
from projects.llava_sam2.rl_train.engine.faults import FAULT_ENV, FAULT_POINTS

REPO = Path(__file__).resolve().parents[1]
OPTIONS = {"default_hooks.checkpoint.interval": 2, "default_hooks.checkpoint.max_keep_ckpts": 1}
_one_thread = pytest.fixture(autouse=True)(one_thread)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Outputs of uninterrupted runs, per runner type and world size."""
    cache = {}

    def get(runner_type: str = "Runner", world: int = 1) -> dict[int, dict]:
        if (runner_type, world) not in cache:
            work_dir = tmp_path_factory.mktemp(f"ref_{runner_type}_{world}")
            assert run_forked(train_toy, world=world, work_dir=str(work_dir), tag="ref", runner_type=runner_type,
                              **OPTIONS) == [0] * world
            cache[runner_type, world] = outputs(work_dir, "ref")
        return cache[runner_type, world]

    return get


def resume_and_compare(work_dir: Path, expected_resume: str, reference: dict, runner_type: str = "Runner",
                       world: int = 1) -> None:
    """The newest complete checkpoint is ``expected_resume``; resuming from it (``resume=True``, which follows
    ``last_checkpoint``) reproduces the uninterrupted run."""
    assert newest_complete_checkpoint(str(work_dir)) == str(work_dir / expected_resume)
    assert run_forked(train_toy, world=world, work_dir=str(work_dir), tag="resumed", resume_from="auto",
                      runner_type=runner_type, **OPTIONS) == [0] * world
    resumed = outputs(work_dir, "resumed")
    start = int(expected_resume.split("_")[1].split(".")[0])
    assert sorted(resumed) == list(range(start + 1, 7))
    for i in resumed:
        assert resumed[i] == reference[i], f"iteration {i} differs after the resume"
    assert not list(work_dir.glob("*.partial")), "leftovers of the killed save were not cleaned up"
    assert sorted(checkpoint_steps(str(work_dir))) == [6]  # max_keep_ckpts=1 holds again


# point killed at -> checkpoint to resume from (the pointer moves only after iter_4 is committed)
EXPECTED = {"checkpoint.written": "iter_2.pth", "checkpoint.side_files_written": "iter_2.pth",
            "checkpoint.committed": "iter_2.pth", "checkpoint.pointer_moved": "iter_4.pth"}


@pytest.mark.parametrize("runner_type", ["Runner", "FlexibleRunner"])  # FlexibleRunner: side files, as DeepSpeed
@pytest.mark.parametrize("point", FAULT_POINTS)
def test_kill_at_each_save_phase_then_resume_matches_the_uninterrupted_run(tmp_path, reference, point, runner_type):
    codes = run_forked(train_toy, work_dir=str(tmp_path), tag="killed", runner_type=runner_type,
                       env={FAULT_ENV: f"{point}@4"}, **OPTIONS)
    assert codes == [KILLED]
    assert (tmp_path / "iter_4.pth").exists() == (point in ("checkpoint.committed", "checkpoint.pointer_moved"))
    if runner_type == "FlexibleRunner":  # the committed checkpoint has its side files
        assert (tmp_path / "iter_2.pth.rng_state.pth").is_file() and (tmp_path / "iter_2.pth.ema_partner.pth").is_file()
    resume_and_compare(tmp_path, EXPECTED[point], reference(runner_type), runner_type)


def test_kill_half_way_through_writing_the_checkpoint_keeps_the_previous_one(tmp_path, reference):
    """A checkpoint file cut in half, with one checkpoint kept: MMEngine's hook has already deleted iter_2 and its
    iter_4.pth is unreadable; here iter_4 never gets its final name and iter_2 stays."""
    codes = run_forked(train_toy_killed_in_write, work_dir=str(tmp_path), tag="killed", path_part="iter_4.pth",
                       **OPTIONS)
    assert codes == [KILLED]
    assert is_loadable(str(tmp_path / "iter_2.pth"))
    resume_and_compare(tmp_path, "iter_2.pth", reference())


def test_two_ranks_killed_before_the_rng_side_file_exists_resume_from_the_previous_checkpoint(tmp_path, reference):
    """Per-rank RNG states live in a side file. MMEngine moved last_checkpoint to iter_4 before that file existed,
    so auto-resume failed on the only checkpoint; here the checkpoint is committed only after its side files."""
    codes = run_forked(train_toy_killed_in_write, world=2, work_dir=str(tmp_path), tag="killed",
                       path_part="iter_4.pth.rng_state", **OPTIONS)
    assert KILLED in codes
    resume_and_compare(tmp_path, "iter_2.pth", reference(world=2), world=2)


def test_two_ranks_killed_after_the_commit_resume_from_the_committed_checkpoint(tmp_path, reference):
    codes = run_forked(train_toy, world=2, work_dir=str(tmp_path), tag="killed",
                       env={FAULT_ENV: "checkpoint.pointer_moved@4@0"}, **OPTIONS)
    assert KILLED in codes
    resume_and_compare(tmp_path, "iter_4.pth", reference(world=2), world=2)


def test_train_py_resume_auto_picks_the_newest_complete_checkpoint(tmp_path, reference):
    assert run_forked(train_toy, work_dir=str(tmp_path), tag="killed", env={FAULT_ENV: "checkpoint.written@4:truncate"},
                      **OPTIONS) == [KILLED]
    assert not is_loadable(str(tmp_path / "iter_4.pth.partial"))  # cut in half, as a kill mid-write leaves it
    train_main = runpy.run_path(str(REPO / "tools/train.py"), run_name="train_tool")["main"]
    args = ["--work-dir", str(tmp_path), "--cfg-options", "default_hooks.checkpoint.interval=2",
            "default_hooks.checkpoint.max_keep_ckpts=1", "train_cfg.max_iters=3"]
    assert train_main([write_toy_config(tmp_path), *args, "--resume", "auto"]) == 0
    checkpoint = torch.load(tmp_path / "iter_3.pth", weights_only=False)
    assert checkpoint["meta"]["iter"] == 3 and checkpoint["message_hub"]["runtime_info"]["iter"] == 2
    assert checkpoint["ema_partner"]["num_updates"] == 3  # resumed after 2 updates, then one more


def test_resume_auto_in_an_empty_work_dir_starts_from_scratch(tmp_path):
    from projects.llava_sam2.rl_train.engine.launch import resolve_resume

    lines = []
    argv = ["cfg.py", "--work-dir", str(tmp_path), "--resume", "auto", "--seed", "1"]
    assert resolve_resume(argv, log=lines.append) == ["cfg.py", "--work-dir", str(tmp_path), "--seed", "1"]
    assert "no complete checkpoint" in lines[0]
    assert resolve_resume(["cfg.py", "--resume=x.pth"]) == ["cfg.py", "--resume", "x.pth"]


def test_newest_complete_checkpoint_skips_unreadable_files(tmp_path):
    good = {"w": torch.ones(3)}
    for step in (2, 4):
        torch.save(good, tmp_path / f"iter_{step}.pth")
    data = (tmp_path / "iter_4.pth").read_bytes()
    (tmp_path / "iter_6.pth").write_bytes(data[: len(data) // 2])  # truncated
    assert newest_complete_checkpoint(str(tmp_path)) == str(tmp_path / "iter_4.pth")
    (tmp_path / "last_checkpoint").write_text(str(tmp_path / "iter_2.pth"))  # the pointer's trajectory wins
    assert newest_complete_checkpoint(str(tmp_path)) == str(tmp_path / "iter_2.pth")
    torch.save(good, tmp_path / "iter_2.pth.rng_state.pth")
    (tmp_path / "iter_2.pth.rng_state.pth").write_bytes(b"garbage")  # a broken side file breaks its checkpoint
    assert newest_complete_checkpoint(str(tmp_path)) == str(tmp_path / "iter_4.pth")


def test_checkpoint_hook_rejects_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="by_epoch=True is not supported"):
        run_config(write_toy_config(tmp_path), tmp_path, **{"default_hooks.checkpoint.by_epoch": True})
    with pytest.raises(ValueError, match="max_keep_ckpts=0"):
        run_config(write_toy_config(tmp_path), tmp_path, **{"default_hooks.checkpoint.max_keep_ckpts": 0})


def test_side_files_need_the_atomic_checkpoint_hook(tmp_path):
    with pytest.raises(ValueError, match="AtomicCheckpointHook"):
        run_config(write_toy_config(tmp_path), tmp_path, runner_type="FlexibleRunner",
                   **{"default_hooks.checkpoint": dict(type="CheckpointHook", interval=3, by_epoch=False)})
