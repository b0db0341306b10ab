"""Fault-injection points for the crash tests (tests/test_engine_faults*.py); inert unless ``$SA2VA_RL_FAULT`` is set.

The checkpoint save path (``hooks/checkpoint.py``) calls :func:`fault_point` between its phases, once per save,
never in the per-step hot path. A test starts a run with ``SA2VA_RL_FAULT=<point>@<step>[@<rank>][:truncate]``
and the process kills itself with SIGKILL (what ``kill -9`` or an OOM kill does) when it reaches ``<point>`` while
saving the checkpoint of iteration ``<step>`` (on rank ``<rank>``, default every rank). ``:truncate`` first cuts
the file named by the point's ``path`` to half its size, the state a kill in the middle of writing it leaves.

Points (in save order, see ``AtomicCheckpointHook``): ``checkpoint.written`` (the checkpoint sits complete under
its temporary name), ``checkpoint.side_files_written`` (side files written, not committed),
``checkpoint.committed`` (renamed to its final name, ``last_checkpoint`` not yet moved),
``checkpoint.pointer_moved`` (before older checkpoints are pruned).
"""
from __future__ import annotations

import os
import signal

FAULT_ENV = "SA2VA_RL_FAULT"
FAULT_POINTS = ("checkpoint.written", "checkpoint.side_files_written", "checkpoint.committed",
                "checkpoint.pointer_moved")


def parse_fault(spec: str) -> tuple[str, int, int | None, bool]:
    """``'<point>@<step>[@<rank>][:truncate]'`` -> (point, step, rank or None, truncate)."""
    body, _, action = spec.partition(":")
    parts = body.split("@")
    if parts[0] not in FAULT_POINTS or len(parts) not in (2, 3) or action not in ("", "truncate"):
        raise ValueError(f"{FAULT_ENV}={spec!r}: expected '<point>@<step>[@<rank>][:truncate]' with <point> one of "
                         f"{FAULT_POINTS}.")
    return parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else None, action == "truncate"


def fault_point(name: str, *, step: int, rank: int, path: str | None = None) -> None:
    """Kill this process with SIGKILL if ``$SA2VA_RL_FAULT`` names this point, step (and rank)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    point, at_step, at_rank, truncate = parse_fault(spec)
    if point != name or at_step != step or (at_rank is not None and at_rank != rank):
        return
    if truncate and path is not None and os.path.isfile(path):
        os.truncate(path, os.path.getsize(path) // 2)
    os.kill(os.getpid(), signal.SIGKILL)
