"""Preemption: SIGTERM / SIGUSR1 in the middle of an iteration make the run finish that
iteration, save a complete checkpoint through AtomicCheckpointHook's atomic path, log a line and exit with
128 + the signal number; with two gloo ranks a signal that reaches one rank stops both after the same iteration.
The resumed run logs what an uninterrupted run logs. Toy algorithm in forked children (tests/fault_tools.py); the
toy sends the signal to its own process after the rollout of the given iteration (``signal_at``).
"""
from __future__ import annotations

import signal

import pytest
import torch

from fault_tools import CRASH_OPTIONS, ReferenceRuns, resume_and_compare, run_forked, train_toy
from grpo_tiny import one_thread
from projects.llava_sam2.rl_train.engine.atomic_files import is_loadable, read_pointer

_one_thread = pytest.fixture(autouse=True)(one_thread)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return ReferenceRuns(tmp_path_factory)


def assert_stopped_after_iteration_3(work_dir) -> None:
    assert read_pointer(str(work_dir)) == str(work_dir / "iter_3.pth")
    assert is_loadable(str(work_dir / "iter_3.pth"))
    assert not (work_dir / "iter_4.pth").exists() and not list(work_dir.glob("*.partial"))
    checkpoint = torch.load(work_dir / "iter_3.pth", weights_only=False)
    assert checkpoint["meta"]["iter"] == 3 and checkpoint["ema_partner"]["num_updates"] == 3


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_stop_signal_mid_iteration_saves_that_iteration_exits_non_zero_and_resumes_exactly(tmp_path, reference,
                                                                                            signum):
    """Checkpoints every 2 iterations; the signal arrives during iteration 3, which used to end the process at
    once (SIGTERM's default action) and lose iteration 3."""
    codes = run_forked(train_toy, work_dir=str(tmp_path), tag="stopped",
                       **{**CRASH_OPTIONS, "train_cfg.algorithm.signal_at": (3, int(signum))})
    assert codes == [128 + signum]
    assert_stopped_after_iteration_3(tmp_path)
    logged = "".join(path.read_text() for path in tmp_path.glob("*/*.log"))
    assert f"{signal.Signals(signum).name} received; stopped after iteration 3" in logged
    resume_and_compare(tmp_path, "iter_3.pth", reference())


def test_two_ranks_stop_after_the_same_iteration_when_one_rank_gets_sigterm(tmp_path, reference):
    """Only rank 1 receives SIGTERM: both ranks agree (one all-reduce per iteration), save iteration 3 together and
    exit 143; the resumed 2-rank run logs what the uninterrupted one logs."""
    codes = run_forked(train_toy, world=2, work_dir=str(tmp_path), tag="stopped", kill_on_failure=False,
                       **{**CRASH_OPTIONS, "train_cfg.algorithm.signal_at": (3, int(signal.SIGTERM), 1)})
    assert codes == [143, 143]
    assert_stopped_after_iteration_3(tmp_path)
    assert (tmp_path / "iter_3.pth.rng_state.pth").is_file()  # both ranks' RNG states
    resume_and_compare(tmp_path, "iter_3.pth", reference(world=2), world=2)


def test_sigusr1_to_every_process_of_the_job_leaves_the_dataloader_workers_alone(tmp_path):
    """SLURM's --signal=USR1@<seconds> reaches every process of a job step. A DataLoader worker killed by it ended the
    run with "DataLoader worker ... is killed by signal" before any save; workers now start with SIGUSR1 blocked."""
    assert run_forked(train_toy, work_dir=str(tmp_path), tag="stopped",
                      **{**CRASH_OPTIONS, "train_dataloader.num_workers": 1, "train_dataloader.persistent_workers": True,
                         "train_cfg.algorithm.signal_at": (3, int(signal.SIGUSR1)),
                         "train_cfg.algorithm.signal_children": True}) == [138]
    assert_stopped_after_iteration_3(tmp_path)
