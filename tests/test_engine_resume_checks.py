"""What `--resume` finds and refuses: in a copied work dir `--resume auto` takes the copy's own
checkpoint, not the one the copied ``last_checkpoint`` names in the original directory; a checkpoint passed over for
not reading back is named; a resume with another process count than the checkpoint's stops with a message naming
both counts (it went on without the RNG states, 2 -> 1, or blamed a missing side file, 1 -> 2). Toy runs in
forked children for the 2-process side (tests/fault_tools.py).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from engine_toy import run_config, write_toy_config
from fault_tools import run_forked, train_toy
from grpo_tiny import one_thread
from projects.llava_sam2.rl_train.engine.launch import resolve_resume

_one_thread = pytest.fixture(autouse=True)(one_thread)
TWO_ITERATIONS = {"train_cfg.max_iters": 2, "default_hooks.checkpoint.interval": 2}


def fake_checkpoints(work_dir: Path, steps=(2, 4)) -> None:
    work_dir.mkdir(parents=True, exist_ok=True)
    for step in steps:
        torch.save({"step": step}, work_dir / f"iter_{step}.pth")
    (work_dir / "last_checkpoint").write_text(str(work_dir / f"iter_{steps[-1]}.pth"))


def test_resume_auto_in_a_copied_work_dir_takes_the_copy_s_checkpoint(tmp_path):
    fake_checkpoints(tmp_path / "run")
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    lines = []
    argv = resolve_resume(["cfg.py", "--work-dir", str(tmp_path / "copy"), "--resume", "auto"], log=lines.append)
    assert argv[-1] == str(tmp_path / "copy" / "iter_4.pth")
    assert any("outside" in line and "copy" in line for line in lines), lines


def test_a_pointer_to_another_directory_is_ignored_when_the_work_dir_has_its_own_checkpoints(tmp_path):
    fake_checkpoints(tmp_path / "run", steps=(2, 4))
    fake_checkpoints(tmp_path / "copy", steps=(2,))
    (tmp_path / "copy" / "last_checkpoint").write_text(str(tmp_path / "run" / "iter_4.pth"))
    argv = resolve_resume(["cfg.py", "--work-dir", str(tmp_path / "copy"), "--resume", "auto"], log=lambda _: None)
    assert argv[-1] == str(tmp_path / "copy" / "iter_2.pth")


def test_resume_auto_names_the_unreadable_checkpoint_it_skips(tmp_path):
    fake_checkpoints(tmp_path, steps=(2, 4))
    data = (tmp_path / "iter_4.pth").read_bytes()
    (tmp_path / "iter_4.pth").write_bytes(data[: len(data) // 2])  # the newest, truncated
    lines = []
    argv = resolve_resume(["cfg.py", "--work-dir", str(tmp_path), "--resume", "auto"], log=lines.append)
    assert argv[-1] == str(tmp_path / "iter_2.pth")
    assert any(f"skipping {tmp_path / 'iter_4.pth'}" in line and "does not read back" in line for line in lines), lines


def test_resuming_a_two_process_checkpoint_with_one_process_names_both_counts(tmp_path):
    assert run_forked(train_toy, world=2, work_dir=str(tmp_path), tag="two", **TWO_ITERATIONS) == [0, 0]
    with pytest.raises(ValueError, match=r"saved by a run of 2 process\(es\) and this run has 1"):
        run_config(write_toy_config(tmp_path), tmp_path, resume_from=str(tmp_path / "iter_2.pth"),
                   **{**TWO_ITERATIONS, "train_cfg.max_iters": 4})


def test_resuming_a_one_process_checkpoint_with_two_processes_names_both_counts(tmp_path):
    run_config(write_toy_config(tmp_path), tmp_path, **TWO_ITERATIONS)
    codes = run_forked(train_toy, world=2, work_dir=str(tmp_path), tag="resumed",
                       resume_from=str(tmp_path / "iter_2.pth"), **{**TWO_ITERATIONS, "train_cfg.max_iters": 4})
    assert codes[0] != 0
    # the first rank to fail takes the other down (run_forked), so only that rank's message is sure to be written
    errors = sorted(tmp_path.glob("resumed.*.error"))
    assert errors, codes
    message = errors[0].read_text()
    assert "saved by a run of 1 process(es) and this run has 2" in message and "side file" not in message
