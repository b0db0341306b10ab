"""TrainStateHook: RNG streams in every checkpoint, and the side files of hooks that own state.

Resuming after iteration k reproduces iterations k+1, k+2, ... of an uninterrupted run only if rollouts sample
from the same random streams. MMEngine re-seeds on resume, which restarts the streams instead of continuing them.
This hook saves each rank's Python / NumPy / torch RNG state with every checkpoint and restores it at the end of
``before_train_epoch``, the last point before ``GRPOLoop`` fetches the first resumed batch (the loop skips the
already-trained batches before its ``before_train`` hooks, so skipping consumes nothing that counts).

It also writes and reads side files for every :class:`StatefulHook` whose state the checkpoint dict cannot carry
(FlexibleRunner / per-rank state; see ``engine/checkpointing.py``). Priority ``LOWEST``: in ``after_train_iter``
and ``after_train`` it runs after ``CheckpointHook`` has saved, so the states it captures are those of the
checkpoint just written.
"""
from __future__ import annotations

import os
from typing import Any

from mmengine.dist import all_gather_object, barrier, get_rank, get_world_size, is_main_process
from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS

from ..checkpointing import (
    StatefulHook,
    capture_rng_state,
    prune_side_files,
    read_side_file,
    restore_rng_state,
    resumed_checkpoint,
    write_side_file,
)


@HOOKS.register_module()
class TrainStateHook(StatefulHook):
    """Checkpoint the RNG state of every rank; write/read the side files of all stateful hooks."""

    priority = "LOWEST"
    state_name = "rng_state"
    is_per_rank = True

    def __init__(self) -> None:
        self._pending_rng: dict[str, Any] | None = None
        self._flushed_checkpoint: str | None = None

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
        """Read the side files of a resumed checkpoint into their hooks (they apply them when ready)."""
        checkpoint = resumed_checkpoint(runner)
        if checkpoint is None:
            return
        for hook in self._side_file_hooks(runner):
            hook.load_state_dict(runner, read_side_file(checkpoint, hook.state_name))

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._flush(runner)

    def after_train(self, runner) -> None:
        self._flush(runner)  # CheckpointHook(save_last=True) may have saved in its after_train

    def _side_file_hooks(self, runner) -> list[StatefulHook]:
        return [h for h in runner.hooks if isinstance(h, StatefulHook) and h.uses_side_file(runner)]

    def _flush(self, runner) -> None:
        """Write side files for the checkpoint CheckpointHook saved since the last call, if any."""
        # CheckpointHook.last_ckpt is None until it saves in this run (the message hub's copy would be the
        # resumed run's path).
        checkpoint = next((h.last_ckpt for h in runner.hooks if isinstance(h, CheckpointHook)), None)
        if checkpoint is None or checkpoint == self._flushed_checkpoint:
            return
        self._flushed_checkpoint = checkpoint
        for hook in self._side_file_hooks(runner):
            state = hook.state_dict(runner)
            if hook.is_per_rank:
                state = all_gather_object(state)  # one entry per rank, every rank takes part
            if is_main_process():
                write_side_file(checkpoint, hook.state_name, state)
        if is_main_process():
            prune_side_files(os.path.dirname(checkpoint))
        barrier()  # no rank may resume-read a side file before it exists
