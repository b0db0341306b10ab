"""TrainStateHook: RNG streams in every checkpoint, and the side files of hooks that own state.

Resuming after iteration k reproduces iterations k+1, k+2, ... of an uninterrupted run only if rollouts sample
from the same random streams. MMEngine re-seeds on resume, which restarts the streams instead of continuing them.
This hook saves each rank's Python / NumPy / torch RNG state with every checkpoint and restores it at the end of
``before_train_epoch``, the last point before ``GRPOLoop`` fetches the first resumed batch (the loop skips the
already-trained batches before its ``before_train`` hooks, so skipping consumes nothing that counts).

It also reads, on resume, the side files of every :class:`StatefulHook` whose state the checkpoint dict cannot
carry (FlexibleRunner / per-rank state; see ``engine/checkpointing.py``). ``AtomicCheckpointHook`` writes them
before it commits each checkpoint, so a committed checkpoint always has them; with side files in play that hook
must replace MMEngine's ``CheckpointHook``, which moved ``last_checkpoint`` before they existed.
"""
from __future__ import annotations

import os
from typing import Any

from mmengine.dist import get_rank, get_world_size
from mmengine.registry import HOOKS

from ..checkpointing import (StatefulHook, capture_rng_state, check_world_size, read_side_file, restore_rng_state,
                             resumed_checkpoint, saved_world_size, side_file)
from ..mmengine_seams import resume_request
from .checkpoint import AtomicCheckpointHook


@HOOKS.register_module()
class TrainStateHook(StatefulHook):
    """Checkpoint the RNG state of every rank; read the side files of all stateful hooks on resume."""

    priority = "LOWEST"
    state_name = "rng_state"
    is_per_rank = True

    def __init__(self) -> None:
        self._pending_rng: dict[str, Any] | None = None

    # ---- this hook's own state: the RNG streams -------------------------------------------------------------

    def state_dict(self, runner) -> dict[str, Any]:
        return capture_rng_state()

    def load_state_dict(self, runner, state: Any) -> None:
        """``state`` is one rank's RNG state (checkpoint dict) or a list with one per rank (side file)."""
        if isinstance(state, list):
            if len(state) != get_world_size():
                raise ValueError(f"TrainStateHook: the checkpoint holds RNG states of {len(state)} ranks but this "
                                 f"run has {get_world_size()}; resume with the same number of processes for an "
                                 "exact resume, or remove TrainStateHook from the config's hooks (in the shipped "
                                 "configs `default_hooks.pop('train_state')`) to resume re-seeded.")
            state = state[get_rank()]
        self._pending_rng = state

    def before_train_epoch(self, runner) -> None:
        if self._pending_rng is not None:
            restore_rng_state(self._pending_rng)
            self._pending_rng = None

    # ---- side files -----------------------------------------------------------------------------------------

    def before_run(self, runner) -> None:
        """Check that side files will be written; read those of a resumed checkpoint into their hooks (they apply
        them when ready)."""
        hooks = self._side_file_hooks(runner)
        if hooks and not any(isinstance(h, AtomicCheckpointHook) for h in runner.hooks):
            raise ValueError(f"TrainStateHook: {[h.state_name for h in hooks]} must be saved in side files here "
                             "(DeepSpeed or several processes), which AtomicCheckpointHook writes before it commits a "
                             "checkpoint; set default_hooks.checkpoint=dict(type=AtomicCheckpointHook, ...) in place "
                             "of MMEngine's CheckpointHook (same arguments).")
        checkpoint = resumed_checkpoint(runner)
        if checkpoint is None:
            return
        for hook in hooks:
            if not os.path.isfile(side_file(checkpoint, hook.state_name)):
                # a checkpoint of a one-process run has no side files: name a process-count change as such
                check_world_size(saved_world_size(checkpoint), checkpoint)
            hook.load_state_dict(runner, read_side_file(checkpoint, hook.state_name))

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """On a resume, check the process count first (a checkpoint of several processes keeps the RNG states in a
        side file, so a one-process resume would otherwise go on without them)."""
        if resume_request(runner)[0]:
            check_world_size((checkpoint.get("meta") or {}).get("world_size"),
                             resumed_checkpoint(runner) or "the checkpoint")
        super().after_load_checkpoint(runner, checkpoint)

    def _side_file_hooks(self, runner) -> list[StatefulHook]:
        return [h for h in runner.hooks if isinstance(h, StatefulHook) and h.uses_side_file(runner)]
