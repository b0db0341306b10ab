"""AtomicCheckpointHook: iteration checkpoints that a kill at any moment cannot corrupt or lose.

MMEngine's ``CheckpointHook`` writes ``iter_<k>.pth`` in place, deletes the oldest kept checkpoint *before* writing
the new one, and moves ``last_checkpoint`` before other hooks write their side files (docs/stack.md §5, §6);
a ``kill -9`` in between leaves a truncated newest checkpoint, no older one (``max_keep_ckpts=1``), or a pointer to
a checkpoint whose RNG side file does not exist. This hook saves in an order where every prefix is safe:

1. (rank 0) drop a leftover ``iter_<k>.pth.partial`` and an older run's ``iter_<k>.pth`` of the same step;
2. ``runner.save_checkpoint`` into ``iter_<k>.pth.partial`` (a file, or a DeepSpeed directory written by every
   rank); the RNG / EMA states the checkpoint dict carries (``StatefulHook``) are inside it;
3. the side files of states the dict cannot carry (per-rank RNG, DeepSpeed), each atomic, under the final name;
4. (rank 0, after a barrier) fsync and rename ``.partial`` -> ``iter_<k>.pth``: the commit;
5. (rank 0) replace ``last_checkpoint`` atomically;
6. (rank 0) delete the checkpoints past ``max_keep_ckpts`` (oldest first) and orphaned side files.

A checkpoint under its final name is therefore complete; ``last_checkpoint`` always names one. Weights with a
NaN or inf are never saved (the run keeps its last good checkpoint). Every checkpoint records the process count
that saved it (``meta['world_size']``, checked on resume by ``TrainStateHook``).

SIGTERM / SIGUSR1 (``engine/stop_signals.py``) make the hook save at the end of the current iteration, on every
rank at the same one, then stop the run with exit status 128 + the signal number (143 for SIGTERM). On a resume,
``before_train`` applies the config's learning rate over the checkpoint's (``checkpointing.apply_configured_lr``).

Resume with ``resume=True`` (follows ``last_checkpoint``) or ``sa2va-rl train CONFIG --resume auto``
(``engine/launch.py``: the pointer if it loads, else the newest complete checkpoint). ``engine/faults.py`` can kill
the process between the phases (tests).
"""
from __future__ import annotations

import glob
import os
import signal
from collections import deque

from mmengine.dist import barrier, get_rank, get_world_size, is_main_process
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..atomic_files import PARTIAL_SUFFIX, POINTER_FILE, atomic_write_text, commit, remove_path
from ..checkpointing import apply_configured_lr, prune_side_files, unwrap_model, write_side_states
from ..faults import fault_point
from ..guard import all_finite
from ..stop_signals import StopSignals


@HOOKS.register_module()
class AtomicCheckpointHook(Hook):
    """Save ``iter_<k>.pth`` every ``interval`` iterations (and after the last one), crash-safely.

    Args mirror MMEngine's ``CheckpointHook`` for iteration-based training:
        interval: iterations between checkpoints (-1: only the last one when ``save_last``).
        by_epoch: must be False (GRPO and SFT runs here are iteration-based).
        save_optimizer: save the optimizer state (needed for an exact resume).
        save_param_scheduler: save the parameter schedulers' state.
        out_dir: directory of the checkpoints (default: the work dir, where ``last_checkpoint`` always lives).
        max_keep_ckpts: complete checkpoints kept (the newest ones); -1 keeps all. The previous checkpoint is
            deleted only after the new one is committed.
        save_last: also save after the last iteration.
        filename_tmpl: checkpoint name with ``{}`` for the iteration.
    """

    priority = "VERY_LOW"
    info_key = "atomic_ckpt_steps"  # message-hub entry: steps of the kept checkpoints (oldest first)

    def __init__(self, interval: int = -1, by_epoch: bool = False, save_optimizer: bool = True,
                 save_param_scheduler: bool = True, out_dir: str | None = None, max_keep_ckpts: int = -1,
                 save_last: bool = True, filename_tmpl: str = "iter_{}.pth") -> None:
        if by_epoch:
            raise ValueError("AtomicCheckpointHook: by_epoch=True is not supported; GRPO and SFT runs here count "
                             "iterations: set by_epoch=False and interval=<iterations>.")
        if max_keep_ckpts == 0 or max_keep_ckpts < -1 or not isinstance(interval, int):
            raise ValueError(f"AtomicCheckpointHook: max_keep_ckpts={max_keep_ckpts}, interval={interval!r}; keep at "
                             "least 1 checkpoint (or -1 for all) and give an integer interval.")
        if filename_tmpl.count("{}") != 1:
            raise ValueError(f"AtomicCheckpointHook: filename_tmpl={filename_tmpl!r} needs exactly one '{{}}'.")
        self.interval, self.save_optimizer, self.save_param_scheduler = interval, save_optimizer, save_param_scheduler
        self.max_keep_ckpts, self.save_last, self.filename_tmpl = max_keep_ckpts, save_last, filename_tmpl
        self._out_dir = out_dir
        self.out_dir: str | None = None
        self.last_ckpt: str | None = None  # set by the first save of this run (CheckpointHook's attribute)
        self._kept: deque[int] = deque()
        self._stop_signals = StopSignals()

    def before_train(self, runner) -> None:
        """Resolve the directory, restore the kept list and apply the config's lr (resume), clear what a killed save
        left behind, and take over the stop signals."""
        self.out_dir = self._out_dir or runner.work_dir
        self._kept = deque(runner.message_hub.get_info(self.info_key) or [])
        apply_configured_lr(runner, self.save_optimizer, self.save_param_scheduler)
        self._stop_signals.install()
        if is_main_process():
            os.makedirs(self.out_dir, exist_ok=True)
            for leftover in glob.glob(os.path.join(glob.escape(self.out_dir), "*" + PARTIAL_SUFFIX)):
                remove_path(leftover)
            prune_side_files(self.out_dir)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        stop = self._stop_signals.agreed()
        is_last = self.is_last_train_iter(runner)
        is_due = self.every_n_train_iters(runner, self.interval) or (self.save_last and is_last)
        saved = self.save(runner, runner.iter + 1) if is_due or stop else None
        if stop and not is_last:
            runner.logger.warning(
                f"AtomicCheckpointHook: {signal.Signals(stop).name} received; stopped after iteration {runner.iter + 1}"
                f" with checkpoint {saved or '(none: weights not finite)'}. Resume with the same command and "
                f"--resume auto. Exit status {128 + stop}.")
            raise SystemExit(128 + stop)

    def after_train(self, runner) -> None:
        self._stop_signals.uninstall()

    def path(self, step: int) -> str:
        return os.path.join(self.out_dir, self.filename_tmpl.format(step))

    def save(self, runner, step: int) -> str | None:
        """Save the checkpoint of iteration ``step`` (every rank calls this); returns its path, None if refused."""
        model = unwrap_model(runner.model)
        if not all_finite([p for p in model.parameters() if p.requires_grad]):
            runner.logger.error(f"AtomicCheckpointHook: not saving iteration {step}: trainable weights hold NaN or "
                                f"inf; the newest complete checkpoint stays {self.last_ckpt or 'the previous one'}.")
            return None
        final, rank = self.path(step), get_rank()
        partial = final + PARTIAL_SUFFIX
        if is_main_process():
            remove_path(partial)
            remove_path(final)  # an abandoned trajectory's checkpoint of this step (resumed from an older one)
        barrier()
        runner.logger.info(f"Saving checkpoint at {step} iterations")
        if step not in self._kept:
            self._kept.append(step)
        runner.message_hub.update_info(self.info_key, list(self._kept))  # travels inside the checkpoint
        runner.message_hub.update_info("last_ckpt", final)
        runner.save_checkpoint(self.out_dir, os.path.basename(partial), save_optimizer=self.save_optimizer,
                               save_param_scheduler=self.save_param_scheduler,
                               meta=dict(epoch=runner.epoch, iter=step, world_size=get_world_size()), by_epoch=False)
        fault_point("checkpoint.written", step=step, rank=rank, path=partial)
        write_side_states(runner, final)
        fault_point("checkpoint.side_files_written", step=step, rank=rank)
        barrier()  # every rank's shards (DeepSpeed) and the side files are written
        if is_main_process():
            commit(partial, final)
            fault_point("checkpoint.committed", step=step, rank=rank)
            atomic_write_text(os.path.join(runner.work_dir, POINTER_FILE), final)
            fault_point("checkpoint.pointer_moved", step=step, rank=rank)
            self._prune()
        self.last_ckpt = final
        barrier()
        return final

    def _prune(self) -> None:
        """Delete the oldest kept checkpoints past ``max_keep_ckpts`` and side files without a checkpoint."""
        while self.max_keep_ckpts > 0 and len(self._kept) > self.max_keep_ckpts:
            remove_path(self.path(self._kept.popleft()))
        prune_side_files(self.out_dir)
