"""Subprocess jobs of the demo: logged to a file, shown as tqdm bars, timed in wall and CPU seconds.

A :class:`Job` is a named list of commands run one after the other (e.g. train, then export). ``run_jobs`` runs
several jobs side by side, one process per job (the demo gives each its own core), polls their logs for progress
and collects each process's own CPU time with ``os.wait4``. A failing command stops its job; ``run_jobs`` then
stops the other jobs it started, prints the tail of the failing log and raises :class:`JobError` carrying the
command's exit code, which ``sa2va-rl demo`` exits with.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

# What progress looks like in each tool's log: MMEngine's LoggerHook ("Iter(train) [ 10/600]") and the tqdm bar of
# `sa2va-rl evaluate` ("... 40/200 [00:10<...").
TRAIN_PROGRESS = re.compile(r"Iter\(train\)\s*\[\s*(\d+)/(\d+)\]")
TQDM_PROGRESS = re.compile(r"(\d+)/(\d+) \[")
POLL_S = 0.5


class JobError(RuntimeError):
    """A demo command failed; ``returncode`` is its exit status, ``log`` the file with its output."""

    def __init__(self, message: str, returncode: int, log: Path):
        super().__init__(message)
        self.returncode = returncode
        self.log = log


@dataclass
class Command:
    """One subprocess: its argv, the log file it writes, and the pattern that reads its progress from the log."""

    argv: list[str]
    log: Path
    progress: re.Pattern | None = None
    label: str = ""


@dataclass
class Job:
    """Commands run in order; filled in while running: wall and CPU seconds per command."""

    name: str
    commands: list[Command]
    seconds: list[dict] = field(default_factory=list)
    _index: int = 0
    _process: subprocess.Popen | None = None
    _started: float = 0.0
    _bar: tqdm | None = None

    @property
    def is_done(self) -> bool:
        return self._index >= len(self.commands) and self._process is None


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").replace("\r", "\n")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _last_progress(path: Path, pattern: re.Pattern) -> tuple[int, int] | None:
    """The last ``done/total`` match in the last 64 KiB of ``path``."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 65536))
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    matches = pattern.findall(text)
    return (int(matches[-1][0]), int(matches[-1][1])) if matches else None


def _start(job: Job, env: dict, position: int) -> None:
    command = job.commands[job._index]
    command.log.parent.mkdir(parents=True, exist_ok=True)
    with open(command.log, "w") as log:
        log.write("$ " + " ".join(command.argv) + "\n")
        log.flush()
        job._process = subprocess.Popen(command.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)  # its own group: stopped as a whole on failure
    job._started = time.perf_counter()
    label = command.label or Path(command.argv[1]).name
    is_tty = sys.stderr.isatty()  # in a CI log, one line every 30 s instead of a redraw every 0.1 s
    job._bar = tqdm(total=None, desc=f"{job.name}: {label}", unit="it", position=position if is_tty else 0,
                    leave=True, dynamic_ncols=True, mininterval=0.1 if is_tty else 30.0)


def _poll(job: Job) -> int | None:
    """Exit code of the job's running command if it ended (its CPU time recorded), else None."""
    command, process = job.commands[job._index], job._process
    if command.progress is not None:
        progress = _last_progress(command.log, command.progress)
        if progress is not None and progress[0] > job._bar.n:
            job._bar.total = progress[1]
            job._bar.update(progress[0] - job._bar.n)  # redraws at most every mininterval
    pid, status, usage = os.wait4(process.pid, os.WNOHANG)
    if pid == 0:
        return None
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    wall = time.perf_counter() - job._started
    job.seconds.append({"command": " ".join(command.argv), "wall_s": round(wall, 1),
                        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1), "log": str(command.log)})
    job._bar.close()
    job._process = None
    job._index += 1
    return process.returncode


def _stop(jobs: Sequence[Job]) -> None:
    for job in jobs:
        if job._process is not None and job._process.returncode is None:
            os.killpg(job._process.pid, signal.SIGTERM)
            job._process.wait()
            job._bar.close()
            job._process = None


def run_jobs(jobs: Sequence[Job], env: dict | None = None) -> None:
    """Run ``jobs`` side by side (each one's commands in order) until all finish; raise JobError on a failure."""
    env = dict(os.environ if env is None else env)
    active = list(jobs)
    try:
        while active:
            for position, job in enumerate(active):
                if job._process is None and not job.is_done:
                    _start(job, env, position)
            time.sleep(POLL_S)
            for job in list(active):
                code = _poll(job)
                if code not in (None, 0):
                    command = job.commands[job._index - 1]
                    _stop(active)
                    raise JobError(f"{job.name}: `{' '.join(command.argv)}` exited with {code}; last lines of "
                                   f"{command.log}:\n{_tail(command.log)}", code, command.log)
                if job.is_done:
                    active.remove(job)
    except KeyboardInterrupt:
        _stop(active)
        raise
