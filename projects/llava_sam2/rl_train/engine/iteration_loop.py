"""IterationLoop: the iteration-based train-loop skeleton under ``GRPOLoop``, on public MMEngine API.

MMEngine's ``IterBasedTrainLoop`` ties a subclass to its internals: its constructor starts the private
``_InfiniteDataloaderIterator`` (which pauses 2 s at every epoch end), and a subclass that needs its own ``run``
(``GRPOLoop`` skips resumed batches before the hooks and replaces empty batches) re-implements that ``run`` over the
parent's private counters and ``_decide_current_val_interval``. This base derives from ``BaseLoop``, MMEngine's
documented loop extension point, and owns what the runner and the hooks read from a train loop: ``dataloader``,
``max_iters`` / ``max_epochs`` / ``iter`` / ``epoch``, ``val_begin`` / ``val_interval`` and the ``stop_training``
switch. Its behaviour is that of ``IterBasedTrainLoop`` (same batches, same order, same draws from the global torch
RNG, same validation schedule; ``tests/test_mmengine_seams.py`` compares them), minus the pause for in-process
loaders.

Before the first batch is drawn (DataLoader workers copy the dataset then), a region dataset gets the model
processor's input check (``give_input_check``), so a sample the model cannot take is a bad sample at load time,
raised or skipped and counted by the dataset's ``on_bad_sample``, not an error inside a training step.
A ``region_collate`` loader also gets the model's processor (``give_step_preprocessing``): its batches then carry
the step's host preprocessing, made in the DataLoader workers (``data.prepared``).

The one MMEngine internal it relies on: ``Runner.resume`` (and ``FlexibleRunner.resume``) write the resumed counters
into ``train_loop._iter`` / ``train_loop._epoch``, so the counters live under those names
(``mmengine_seams.LOOP_RESUME_ATTRIBUTES``, canary-tested).
"""
from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Mapping
from functools import partial

from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.runner import BaseLoop
from mmengine.runner.utils import calc_dynamic_intervals
from torch.utils.data import DataLoader

from ..data.collate import PreprocessingCollate, region_collate
from .builders import input_check_from_config
from .stop_signals import blocked_in_children

EPOCH_PAUSE_S = 2.0  # between epochs of a loader that starts new worker processes each epoch (InfiniteBatches)


def _set_epoch(dataloader, epoch: int) -> None:
    """Tell the loader's sampler which epoch starts (looked up as MMEngine's loops do)."""
    sampler = getattr(dataloader, "sampler", None)
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
        return
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    if hasattr(getattr(batch_sampler, "sampler", None), "set_epoch"):
        batch_sampler.sampler.set_epoch(epoch)


class InfiniteBatches:
    """The batches of a DataLoader without end: when an epoch ends, the sampler gets ``set_epoch(epoch + 1)`` and
    the next epoch starts (the same batches, order and global-RNG draws as MMEngine's ``_InfiniteDataloaderIterator``:
    one ``iter(dataloader)`` now and one per epoch).

    MMEngine also pauses 2 s at every epoch end, a workaround for an unexplained DataLoader deadlock when worker
    processes are released and restarted (open-mmlab/mmcv#306, #1912). Here the pause stays only where workers do
    restart (``num_workers > 0`` without ``persistent_workers``); in-process and persistent-worker loaders go on.
    Worker processes start with SIGUSR1 blocked, so SLURM's SIGUSR1 to every process of a job reaches only the main
    process, which saves and stops (``stop_signals.blocked_in_children``).
    """

    def __init__(self, dataloader: DataLoader, pause_s: float = EPOCH_PAUSE_S) -> None:
        self.dataloader, self.pause_s = dataloader, pause_s
        self.epoch = 0
        with blocked_in_children():  # worker processes ignore SIGUSR1 (stop_signals.py)
            self._batches = iter(dataloader)

    def __iter__(self) -> InfiniteBatches:
        return self

    def __next__(self):
        try:
            return next(self._batches)
        except StopIteration:
            pass
        self.epoch += 1
        _set_epoch(self.dataloader, self.epoch)
        print_log(f"dataloader epoch {self.epoch} begins.", logger="current", level=logging.INFO)
        if getattr(self.dataloader, "num_workers", 0) > 0 and not getattr(self.dataloader, "persistent_workers", False):
            time.sleep(self.pause_s)
        with blocked_in_children():
            self._batches = iter(self.dataloader)
        return next(self._batches)


class IterationLoop(BaseLoop):
    """Counters, validation schedule and an endless batch iterator for an iteration-based train loop; subclasses
    write ``run`` (module docstring).

    Args:
        runner: the MMEngine runner.
        dataloader: a DataLoader or its config (built by ``BaseLoop`` with the runner's seed settings).
        max_iters: iterations to train.
        val_begin: first iteration after which validation may run.
        val_interval: iterations between validations (until the first ``dynamic_intervals`` milestone).
        dynamic_intervals: ``[(milestone, interval), ...]``: the interval to use from each milestone on.
    """

    def __init__(self, runner, dataloader: DataLoader | dict, max_iters: int, val_begin: int = 1,
                 val_interval: int = 1000, dynamic_intervals: list[tuple[int, int]] | None = None) -> None:
        super().__init__(runner, dataloader)
        if isinstance(max_iters, bool) or int(max_iters) != max_iters or max_iters < 0:
            raise ValueError(f"train_cfg.max_iters={max_iters!r}: give a whole number of iterations >= 0.")
        self._max_iters = int(max_iters)
        self._max_epochs = 1  # the whole run is one "epoch", as in IterBasedTrainLoop
        self._epoch = 0  # resume contract: Runner.resume writes _epoch and _iter (mmengine_seams)
        self._iter = 0
        self.val_begin, self.val_interval = val_begin, val_interval
        self.stop_training = False  # set by EarlyStoppingHook
        meta = getattr(self.dataloader.dataset, "metainfo", None)
        if meta is not None:
            runner.visualizer.dataset_meta = meta
        give_input_check(self.dataloader.dataset, runner.model)
        give_step_preprocessing(self.dataloader, runner.model)
        self.dataloader_iterator = InfiniteBatches(self.dataloader)
        self.dynamic_milestones, self.dynamic_intervals = calc_dynamic_intervals(val_interval, dynamic_intervals)

    @property
    def max_epochs(self) -> int:
        return self._max_epochs

    @property
    def max_iters(self) -> int:
        return self._max_iters

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def iter(self) -> int:
        return self._iter

    def build_dataloader(self, dataloader: DataLoader | dict) -> DataLoader:
        """A second dataloader (e.g. SFT batches), built from its config as ``BaseLoop`` builds the main one."""
        return _DataloaderOnly(self.runner, dataloader).dataloader

    def validate_if_due(self) -> None:
        """After an iteration: pick the interval of the current milestone, then validate if one is due."""
        step = bisect.bisect(self.dynamic_milestones, self._iter + 1)
        self.val_interval = self.dynamic_intervals[step - 1]
        if (self.runner.val_loop is not None and self._iter >= self.val_begin
                and (self._iter % self.val_interval == 0 or self._iter == self._max_iters)):
            self.runner.val_loop.run()


def give_input_check(dataset, model) -> None:
    """Hand the model processor's ``input_check`` to ``dataset`` (and to each part of a concatenated dataset) when
    both sides have one: ``Sa2VATrainModel.processor`` and ``data.base.RegionDataset.set_input_check``. Under
    ``FlexibleRunner`` (DeepSpeed) the model is still its config here: the check is then read from that config."""
    model = model.module if is_model_wrapper(model) else model
    if isinstance(model, Mapping):
        check = input_check_from_config(model)
    else:
        check = getattr(getattr(model, "processor", None), "input_check", None)
    if check is None:
        return
    for part in getattr(dataset, "datasets", None) or [dataset]:
        if hasattr(part, "set_input_check"):
            part.set_input_check(check)


def give_step_preprocessing(dataloader, model) -> bool:
    """Let a ``region_collate`` loader build its batches with ``PreprocessingCollate`` and the model's processor, so
    that the step's host preprocessing (tiles, SAM2 inputs, masks, region cells) runs in the DataLoader workers
    instead of the step (``data.prepared``). Does nothing, returning False, for another collate or a model without a
    processor (under ``FlexibleRunner`` the model is still its config here: the step then preprocesses)."""
    model = model.module if is_model_wrapper(model) else model
    processor = getattr(model, "processor", None)
    collate = getattr(dataloader, "collate_fn", None)
    if isinstance(collate, partial) and not collate.args and not collate.keywords:  # MMEngine's dict(type=fn)
        collate = collate.func
    if collate is not region_collate or getattr(processor, "preprocessing_settings", None) is None:
        return False
    dataloader.collate_fn = PreprocessingCollate(processor)
    return True


class _DataloaderOnly(BaseLoop):
    """``BaseLoop``'s constructor, used only to build a dataloader config with the runner's seed settings."""

    def run(self) -> None:
        raise NotImplementedError("_DataloaderOnly only builds a dataloader")
