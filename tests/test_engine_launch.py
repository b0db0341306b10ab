"""Launch paths of `sa2va-rl train` (tools/train.py) and tools/dist_train.sh on CPU, with the toy algorithm
(tests/engine_toy.py).

Launches are slow by nature (each process imports the whole stack), so only three: a 2-process gloo DDP run, a
2-process DeepSpeed ZeRO-2 run resumed from its checkpoint, and a 2-process run whose launcher is killed. The train
command's exit status is checked in-process: its ``main`` runs XTuner's trainer in the calling process, so a failure
propagates as an exception (exit status 1).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from engine_toy import write_toy_config
from projects.llava_sam2.rl_train.cli.train import main as train_main
from projects.llava_sam2.rl_train.engine.launch import set_cpu_threads

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
CPU_DEEPSPEED = REPO / "projects/llava_sam2/configs/rl/deepspeed_zero2_cpu.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: list[str], **env) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{REPO}", "PYTHON": sys.executable,
               "PORT": str(free_port()), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(args, cwd=REPO, env=environ, capture_output=True, text=True, timeout=300)


def logged_scalars(work_dir: Path) -> dict[int, dict]:
    """step -> scalars of the last run in ``work_dir`` (LoggerHook's vis_data/scalars.json)."""
    runs = sorted(work_dir.glob("2*/vis_data/scalars.json"))
    rows = [json.loads(line) for line in runs[-1].read_text().splitlines()]
    return {row["step"]: row for row in rows}


def test_train_py_propagates_training_failures(tmp_path):
    config = write_toy_config(tmp_path)
    with pytest.raises(RuntimeError, match="failing on purpose"):  # `xtuner train` exits 0 here (stack.md §1)
        train_main([config, "--work-dir", str(tmp_path / "fail"), "--cfg-options", "train_cfg.algorithm.fail_at_iter=1",
                    "train_cfg.max_iters=2"])
    assert train_main([config, "--work-dir", str(tmp_path / "ok"), "--cfg-options", "train_cfg.max_iters=2"]) == 0
    assert (tmp_path / "ok" / "iter_2.pth").is_file()  # CheckpointHook(save_last=True) at the end


def test_dist_train_two_process_gloo_ddp(tmp_path):
    config = write_toy_config(tmp_path)
    work_dir = tmp_path / "ddp"
    result = launch(["bash", "tools/dist_train.sh", config, "2", "--work-dir", str(work_dir),
                     "--cfg-options", "train_cfg.max_iters=3", "log_level=INFO"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Distributed training: True" in result.stdout and "GPU number: 2" in result.stdout
    checkpoint = torch.load(work_dir / "iter_3.pth", weights_only=False)
    assert checkpoint["ema_partner"]["num_updates"] == 3
    # per-rank RNG streams cannot go through rank 0's checkpoint hook: one side file, one state per rank
    rng_states = torch.load(f"{work_dir}/iter_3.pth.rng_state.pth", weights_only=False)
    assert len(rng_states) == 2
    logged = logged_scalars(work_dir)[3]
    # the toy reward is hit + 0.1 x the EMA partner's probability of the action (tests/engine_toy.py), both means
    # over the global batch of 2 ranks: the reward exceeds the hit rate by the partner's share, which lies in (0, 0.1)
    assert 0 < logged["toy/reward_mean"] - logged["toy/hit/mean"] < 0.1, logged
    assert logged["toy/judge/failures/timeout"] == 2  # each rank counts one failure; counts are summed over ranks


def test_dist_train_deepspeed_zero2_resume_is_exact(tmp_path):
    config = write_toy_config(tmp_path)
    work_dir = tmp_path / "ds"
    common = ["--work-dir", str(work_dir), "--cfg-options", "train_cfg.max_iters=4",
              "default_hooks.checkpoint.interval=2"]
    full = launch(["bash", "tools/dist_train.sh", config, "2", *common], DEEPSPEED=str(CPU_DEEPSPEED))
    assert full.returncode == 0, full.stderr[-3000:]
    assert "ZeRO stage 2" in full.stdout + full.stderr
    full_logs = logged_scalars(work_dir)
    for name in ("ema_partner", "rng_state"):  # DeepSpeed never calls the checkpoint hooks (docs/stack.md §6)
        assert (work_dir / f"iter_2.pth.{name}.pth").is_file(), name

    resumed = launch(["bash", "tools/dist_train.sh", config, "2", *common, "--resume", str(work_dir / "iter_2.pth")],
                     DEEPSPEED=str(CPU_DEEPSPEED))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    resumed_logs = logged_scalars(work_dir)
    assert sorted(resumed_logs) == [3, 4]
    for step in (3, 4):
        for key in ("loss", "logp_mean", "toy/reward_mean", "lr"):
            assert resumed_logs[step][key] == full_logs[step][key], (step, key)


def torchrun_workers(marker: str) -> list[int]:
    """Live processes started by torchrun (``TORCHELASTIC_RUN_ID`` set) whose environment carries ``marker``."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"TEST_MARKER={marker}".encode() in environ and state != "Z" and any(
                item.startswith(b"TORCHELASTIC_RUN_ID=") for item in environ):
            pids.append(int(entry))
    return pids


def test_kill_9_of_the_launcher_process_group_takes_the_workers_down(tmp_path):
    """torchrun starts workers in sessions of their own: kill -9 of its process group used to leave them training
    and writing checkpoints. tools/train.py arms PR_SET_PDEATHSIG in torchrun workers (engine/launch.py)."""
    config, marker, work_dir = write_toy_config(tmp_path), uuid.uuid4().hex, tmp_path / "run"
    environ = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{REPO}", "PYTHON": sys.executable,
               "PORT": str(free_port()), "OMP_NUM_THREADS": "1", "TEST_MARKER": marker}
    launcher = subprocess.Popen(
        ["bash", "tools/dist_train.sh", config, "2", "--work-dir", str(work_dir), "--cfg-options",
         "train_cfg.max_iters=1000000", "default_hooks.checkpoint.interval=1000000"],
        cwd=REPO, env=environ, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = []
    try:
        deadline = time.monotonic() + 240
        while not list(work_dir.glob("*/vis_data/scalars.json")):  # both workers are training
            assert launcher.poll() is None and time.monotonic() < deadline, "the run did not start"
            time.sleep(0.5)
        workers = torchrun_workers(marker)
        assert len(workers) == 2
        os.killpg(launcher.pid, signal.SIGKILL)  # the launcher's process group: bash exec'd torchrun
        launcher.wait()
        deadline = time.monotonic() + 30
        while torchrun_workers(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert torchrun_workers(marker) == [], "workers outlived their launcher"
    finally:
        for pid in torchrun_workers(marker):  # only processes this test started
            os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)


def test_set_cpu_threads_keeps_the_users_choice(monkeypatch):
    threads = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        torch.set_num_threads(2)
        assert set_cpu_threads() == 2 and torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"
        monkeypatch.delenv("OMP_NUM_THREADS")
        monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
        assert set_cpu_threads() == 1 and torch.get_num_threads() == 1
        assert (os.environ["OMP_NUM_THREADS"], os.environ["MKL_NUM_THREADS"]) == ("1", "1")  # for child processes
    finally:
        torch.set_num_threads(threads)


def test_cpu_train_runs_inside_cpu_launch_with_one_thread(monkeypatch):
    # what `sa2va-rl train` does on a CPU machine with OMP_NUM_THREADS unset; xtuner's main records what it sees
    import xtuner.tools.train as xtuner_train

    seen, threads, set_device = {}, torch.get_num_threads(), torch.cuda.set_device
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(xtuner_train, "main", lambda: seen.update(
        threads=torch.get_num_threads(), omp=os.environ.get("OMP_NUM_THREADS"),
        is_patched=torch.cuda.set_device is not set_device, argv=list(sys.argv)))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    try:
        assert train_main(["config.py", "--seed", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert seen == dict(threads=1, omp="1", is_patched=True, argv=["sa2va-rl train", "config.py", "--seed", "1"])
    assert torch.cuda.set_device is set_device  # restored after the run


def test_gpu_train_also_uses_one_cpu_thread_per_process(monkeypatch):
    """A one-process GPU run (`sa2va-rl train` without torchrun) gets the one intra-op thread torchrun gives each
    worker: with the default thread count the host-bound 4B step ran 1.35x slower on an H100 (docs/gpu.md)."""
    import xtuner.tools.train as xtuner_train

    seen, threads = {}, torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(xtuner_train, "main", lambda: seen.update(threads=torch.get_num_threads(),
                                                                  omp=os.environ.get("OMP_NUM_THREADS")))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    torch.set_num_threads(2)
    try:
        assert train_main(["config.py"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert seen == dict(threads=1, omp="1")
