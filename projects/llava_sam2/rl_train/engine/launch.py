"""Launch behaviour of ``sa2va-rl train`` (``tools/train.py`` runs it): workers die with their launcher;
``--resume auto``.

* ``die_with_parent``: torchrun starts every worker in a session of its own (``start_new_session=True`` in
  ``torch.distributed.elastic``), so ``kill -9`` of torchrun or of its process group leaves the workers running,
  still training and writing checkpoints into the work dir. A worker that torchrun started asks the kernel to
  SIGKILL it when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``). Plain ``sa2va-rl train`` runs are left
  alone: a run started under ``nohup`` must outlive its shell.
* ``resolve_resume``: ``--resume auto`` becomes ``--resume <the newest complete checkpoint of the work dir>``
  (``atomic_files.newest_complete_checkpoint``: ``last_checkpoint`` if it loads, else the highest step that
  does; a checkpoint passed over is named in a log line, and a ``last_checkpoint`` copied along with the work dir
  resolves to the copy's own file), or is dropped, with a log line, when the work dir has none (a first launch and a
  relaunch after a preemption are then the same command).
* ``set_cpu_threads``: unless the user set ``OMP_NUM_THREADS``, every run uses ``CPU_THREADS`` = 1 intra-op thread
  per process (``torch.set_num_threads`` here, ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` for child processes), as
  torchrun does for its workers. On CPU the tiny configs' ops are too small for a second thread to pay, and OpenMP
  spin-waiting makes extra threads very slow on shared cores (docs/benchmarks.md "CPU threads"). On a GPU the step is
  host-bound (hundreds of thousands of kernel launches) and the host's small tensor work between them suffers the
  same way: the 4B-shaped smoke step on one H100 took 8.7 s with the default 32 threads and 6.4 s with one
  (docs/gpu.md).
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

from .atomic_files import newest_complete_checkpoint

logger = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
CPU_THREADS = 1  # intra-op CPU threads per process when OMP_NUM_THREADS is unset (module doc)


def is_torchrun_worker() -> bool:
    """True in a process started by torchrun's elastic agent."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent (torchrun) dies; only in torchrun workers on
    Linux. Returns True when armed."""
    if not is_torchrun_worker() or not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent == 1 or os.getppid() != parent:  # the parent died before the signal was armed
        os.kill(os.getpid(), sig)
    return True


def _work_dir(argv: list[str]) -> str:
    """The work dir xtuner's train.py will use: ``--work-dir``, else the config's ``work_dir``, else
    ``./work_dirs/<config name>``."""
    for index, arg in enumerate(argv):
        if arg == "--work-dir" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--work-dir="):
            return arg.split("=", 1)[1]
    from mmengine.config import Config

    config = argv[0]
    work_dir = Config.fromfile(config).get("work_dir")
    return work_dir or os.path.join("./work_dirs", os.path.splitext(os.path.basename(config))[0])


def resolve_resume(argv: list[str], log=print) -> list[str]:
    """``argv`` of ``sa2va-rl train`` with ``--resume auto`` replaced (module docstring); other argv unchanged."""
    argv = [part for arg in argv for part in (arg.split("=", 1) if arg.startswith("--resume=") else [arg])]
    index = argv.index("--resume") if "--resume" in argv else -1
    if index < 0 or index + 1 >= len(argv) or argv[index + 1] != "auto":
        return argv
    work_dir = _work_dir(argv)
    checkpoint = newest_complete_checkpoint(work_dir, log=lambda line: log(f"--resume auto: {line}"))
    if checkpoint is None:
        log(f"--resume auto: no complete checkpoint in {work_dir}; training from the start.")
        return argv[:index] + argv[index + 2:]
    log(f"--resume auto: resuming from {checkpoint}, the newest complete checkpoint in {work_dir}.")
    return argv[:index + 1] + [checkpoint] + argv[index + 2:]


def set_cpu_threads(threads: int = CPU_THREADS) -> int:
    """Use ``threads`` intra-op threads unless ``OMP_NUM_THREADS`` is set (the user's choice wins); returns the
    count in use."""
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # DataLoader workers and other children
        os.environ.setdefault(name, str(threads))
    torch.set_num_threads(threads)
    logger.info("CPU run: %d intra-op thread(s) per process (set OMP_NUM_THREADS to choose another count)", threads)
    return threads
