"""StopSignals: SIGTERM / SIGUSR1 ask a run to checkpoint and stop at the end of the current iteration.

SLURM and Kubernetes send SIGTERM before they kill a job (SLURM's ``--signal=USR1@<seconds>`` sends SIGUSR1 ahead
of the time limit); by default it ends the process at once and loses everything since the last checkpoint. The
handler only records the signal (nothing else is safe inside a signal handler); ``AtomicCheckpointHook`` asks
``agreed()`` after every iteration, on every rank, so all ranks stop after the same iteration even when the signal
reached them at different moments, then saves through its atomic path and exits with ``128 + signal number``
(143 for SIGTERM), the status a process killed by that signal reports.

A second stop signal gets the action the signal had before (by default: the process ends at once).

SLURM's ``--signal=USR1@<seconds>`` reaches every process of the job step, DataLoader workers included, and a worker
killed by it ends the run ("DataLoader worker ... is killed by signal") before the save. Workers therefore start with
SIGUSR1 blocked (``blocked_in_children``). SIGTERM stays as torch sets it up in a worker: its parent stops the worker
with it, so it cannot be blocked there; a SIGTERM sent to every process of a job (SLURM's own, at the time limit or
on ``scancel``) still kills the workers, so on SLURM ask for SIGUSR1 ahead of the end.

The time from the signal to the exit is the rest of the current iteration plus one checkpoint save; give the job
that much grace (``--signal=USR1@<seconds>``, Kubernetes' ``terminationGracePeriodSeconds``; torchrun gives its
workers 30 s after forwarding a SIGTERM).
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

import torch
from mmengine.dist import all_reduce, get_world_size

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
CHILD_BLOCKED_SIGNALS = (signal.SIGUSR1,)  # blocked in worker processes (module docstring)


@contextlib.contextmanager
def blocked_in_children(signals: tuple[int, ...] = CHILD_BLOCKED_SIGNALS) -> Iterator[None]:
    """Block ``signals`` while the block runs (start worker processes inside it): children inherit the mask and
    keep them blocked; this process gets a signal that arrived meanwhile when the block ends."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class StopSignals:
    """Record ``STOP_SIGNALS`` while installed; ``agreed()`` tells every rank whether any rank received one."""

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS) -> None:
        self.signals = signals
        self.received: int | None = None  # the first stop signal this process received
        self._previous: dict[int, object] = {}

    def install(self) -> bool:
        """Take over the stop signals (main thread only, where Python runs handlers); returns True if installed."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._record)
        return True

    def uninstall(self) -> None:
        """Give the signals back to the handlers they had before ``install``."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _record(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signum
            return
        # a second stop signal: the default action (a handler left behind by a run that died of an exception
        # swallows one signal at most)
        self.uninstall()
        os.kill(os.getpid(), signum)

    def agreed(self) -> int | None:
        """The stop signal if any rank received one (the highest number among them), else None. Every rank must call
        this at the same point (one all-reduce)."""
        received = torch.tensor([float(self.received or 0)])
        if get_world_size() > 1:
            all_reduce(received, op="max")
        return int(received.item()) or None
