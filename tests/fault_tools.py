"""Helpers of the failure tests: toy training runs in forked children (a SIGKILL ends the child, not pytest), as one
process or as gloo ranks, their recorded outputs, and checkpoint contents (tests only).

Children come from a fork server that imported the stack once (a fresh interpreter takes ~10 s to import it), never
from pytest itself: once any earlier test has run a backward pass, autograd refuses to run in a child forked from
that process ("Unable to handle autograd's threading in combination with fork-based multiprocessing").
"""
from __future__ import annotations

import faulthandler
import io
import json
import multiprocessing
from multiprocessing import forkserver
import os
import signal
import socket
import time
from pathlib import Path
from unittest import mock

import torch

from engine_toy import run_config, write_toy_config

KILLED = -signal.SIGKILL  # exit code of a child killed by SIGKILL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(target, rank: int, world: int, port: int, env: dict, timeout: float, kwargs: dict) -> None:
    faulthandler.dump_traceback_later(max(1.0, timeout - 5))  # a child about to be killed for time says where it is
    os.environ.update(env)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                          WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    from projects.llava_sam2.rl_train.engine.mmengine_seams import cpu_launch

    with cpu_launch():
        target(**kwargs)


def _fork_server():
    """The fork server, started once with this module imported (so torch, MMEngine and the engine are imported once
    for all children). Python 3.11's server ignores the parent's ``sys.path``: it finds this folder through
    ``PYTHONPATH``, set only while it starts."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    with mock.patch.dict(os.environ, PYTHONPATH=path):
        forkserver.ensure_running()
    return ctx


def run_forked(target, *, world: int = 1, env: dict | None = None, timeout: float = 240, kill_on_failure: bool = True,
               **kwargs) -> list[int]:
    """Run ``target(**kwargs)`` in ``world`` forked processes (gloo ranks when > 1); returns their exit codes.

    When one rank exits with a failure the others are SIGKILLed too (they would wait in a collective forever), as
    when a node dies or torchrun takes its workers down; ``kill_on_failure=False`` lets every rank end by itself
    (runs whose ranks all stop with the same non-zero status, e.g. after a SIGTERM).
    """
    ctx = _fork_server()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(target, rank, world, port, env or {}, timeout, kwargs))
             for rank in range(world)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        if kill_on_failure and any(p.exitcode is not None and p.exitcode != 0 for p in procs):
            for p in procs:
                if p.is_alive():
                    p.kill()
        time.sleep(0.05)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join()
    return [p.exitcode for p in procs]


def train_toy(work_dir: str, tag: str, resume_from: str | None = None, runner_type: str = "Runner",
              hub_scalars: tuple[str, ...] = (), **options) -> None:
    """Child body: train the toy config in ``work_dir`` and write this rank's outputs to ``<tag>.<rank>.json``
    (and the message hub's last values of ``hub_scalars`` to ``<tag>.<rank>.hub.json``). An exception's message
    goes to ``<tag>.<rank>.error`` before it ends the child."""
    from mmengine.dist import get_rank

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        options["launcher"] = "pytorch"
    try:
        runner, record = run_config(write_toy_config(work_dir), work_dir, runner_type=runner_type,
                                    resume_from=resume_from, **options)
    except Exception as error:
        Path(work_dir, f"{tag}.{int(os.environ.get('RANK', 0))}.error").write_text(str(error))
        raise
    Path(work_dir, f"{tag}.{get_rank()}.json").write_text(json.dumps(record.outputs))
    if hub_scalars:
        values = {key: runner.message_hub.get_scalar(key).current() for key in hub_scalars}
        Path(work_dir, f"{tag}.{get_rank()}.hub.json").write_text(json.dumps(values))


def train_toy_killed_in_write(work_dir: str, tag: str, path_part: str, fraction: float = 0.5, **options) -> None:
    """``train_toy``, SIGKILLed while it writes the first file whose path contains ``path_part``, after writing
    ``fraction`` of its bytes. Works for any save code: it patches the two writers checkpoints go through
    (MMEngine's ``LocalBackend.put`` and ``torch.save`` to a path)."""
    from mmengine.fileio.backends import local_backend

    def die_writing(data: bytes, filepath) -> None:
        with open(filepath, "wb") as f:
            f.write(data[: int(len(data) * fraction)])
        os.kill(os.getpid(), signal.SIGKILL)

    original_put, original_save = local_backend.LocalBackend.put, torch.save

    def put(self, obj: bytes, filepath) -> None:
        if path_part in str(filepath):
            die_writing(obj, filepath)
        original_put(self, obj, filepath)

    def save(obj, f, *args, **kwargs) -> None:
        if isinstance(f, (str, os.PathLike)) and path_part in str(f):
            buffer = io.BytesIO()
            original_save(obj, buffer, *args, **kwargs)
            die_writing(buffer.getvalue(), f)
        original_save(obj, f, *args, **kwargs)

    local_backend.LocalBackend.put, torch.save = put, save
    train_toy(work_dir, tag, **options)


def outputs(work_dir, tag: str, rank: int = 0) -> dict[int, dict[str, float]]:
    """Iteration -> logged outputs written by ``train_toy``."""
    return {int(k): v for k, v in json.loads(Path(work_dir, f"{tag}.{rank}.json").read_text()).items()}


def trainable_weights(checkpoint) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]


# ---- crash tests: kill, resume, compare --------------------------------------------------------------------------

# 6 iterations, a checkpoint every 2, one kept: the setting where MMEngine's CheckpointHook deleted the only
# checkpoint before writing the next
CRASH_OPTIONS = {"default_hooks.checkpoint.interval": 2, "default_hooks.checkpoint.max_keep_ckpts": 1}


class ReferenceRuns:
    """Outputs of uninterrupted runs (``CRASH_OPTIONS``), per runner type and world size, computed once."""

    def __init__(self, tmp_path_factory) -> None:
        self.factory, self.cache = tmp_path_factory, {}

    def __call__(self, runner_type: str = "Runner", world: int = 1) -> dict[int, dict]:
        if (runner_type, world) not in self.cache:
            work_dir = self.factory.mktemp(f"ref_{runner_type}_{world}")
            assert run_forked(train_toy, world=world, work_dir=str(work_dir), tag="ref", runner_type=runner_type,
                              **CRASH_OPTIONS) == [0] * world
            self.cache[runner_type, world] = outputs(work_dir, "ref")
        return self.cache[runner_type, world]


def resume_and_compare(work_dir: Path, expected_resume: str, reference: dict, runner_type: str = "Runner",
                       world: int = 1) -> None:
    """Resume with ``resume=True`` (MMEngine follows ``last_checkpoint``): it must start after
    ``expected_resume``, which is also the newest complete checkpoint, and log what the uninterrupted run logged;
    the killed save's leftovers are gone and ``max_keep_ckpts=1`` holds again."""
    assert run_forked(train_toy, world=world, work_dir=str(work_dir), tag="resumed", resume_from="auto",
                      runner_type=runner_type, **CRASH_OPTIONS) == [0] * world, "the resumed run failed"
    resumed = outputs(work_dir, "resumed")
    start = int(expected_resume.split("_")[1].split(".")[0])
    assert sorted(resumed) == list(range(start + 1, 7))
    for i in resumed:
        assert resumed[i] == reference[i], f"iteration {i} differs after the resume"
    from projects.llava_sam2.rl_train.engine.atomic_files import checkpoint_steps, newest_complete_checkpoint

    assert not list(work_dir.glob("*.partial")), "leftovers of the killed save were not cleaned up"
    assert sorted(checkpoint_steps(str(work_dir))) == [6]
    assert newest_complete_checkpoint(str(work_dir)) == str(work_dir / "iter_6.pth")
