"""GRPOLoop: the MMEngine train loop of a GRPO run; it decides *when*, the algorithm decides *what*.

The algorithm is any ``grpo.protocol.GRPOAlgorithm`` (stages, ownership: grpo/protocol.py). One iteration
(``run_iter``) reads as the training step of docs/architecture.md::

    hook before_train_iter(batch_idx, data_batch)
    with model.rollout_context(optim_wrapper):             # the train model's precision for no-grad passes
        features = algo.encode(batch)                      # frozen encoders, once per image
        sampled = algo.rollout(features)                   # SampledStep: one rollout per active loop, no grad
    hook after_rollout(batch_idx, data_batch, sampled.rollouts)
    scored = algo.score(sampled)                           # ScoredStep: rewards and reward_stats set
    hook after_reward(batch_idx, data_batch, scored.rollouts)
    advantaged = algo.compute_advantages(scored)           # AdvantagedStep: advantages set
    with model.update_context(optim_wrapper):
        for mb in algo.minibatches(advantaged):            # num_iterations x chunks
            runner.model.train_step({'grpo_batch': mb, 'algorithm': algo (+ the SFT batch on the first)},
                                    optim_wrapper)
    algo.after_optimizer_step()
    hook after_train_iter(batch_idx, data_batch, outputs)   # EMAPartnerHook updates algo.weights' partner here

Each stage's value is checked against the hand-off type the protocol names (``check_stage_output``).

Gradient-carrying work always runs inside ``runner.model.train_step`` so DDP / DeepSpeed wrappers see a normal
forward and backward. ``outputs`` holds the mean ``train_step`` logs over the iteration's minibatches (loss, KL,
clip fractions, ...), per-loop rollout metrics (``engine/stats.py``), the seconds per phase (``time/encode``,
``time/rollout``, ``time/score``, ``time/update``) and the failure counts below, reduced over ranks; ``LoggerHook``
prints them.

Failure behaviour (docs/failure_behaviour.md): an optimizer step with a NaN / inf loss or gradient, or one that
would move the weights by more than ``max_update_ratio`` times their norm, is skipped by ``StepGuard``
(engine/guard.py; weights, optimizer state and EMA partner unchanged; ``guard/skipped_steps``,
``guard/applied_steps``) and ``max_consecutive_skips`` such iterations in a row stop the run with
``FloatingPointError``. A batch that ``on_bad_sample='skip'`` left empty on a rank is replaced by that rank's next
batch, while the other ranks keep theirs (``data/empty_batches``, summed over ranks); the batches each rank drew are
counted in the message hub, so a resume skips exactly those. A failure count logged once is logged at every later
iteration, 0 when the cause is absent (``stats.zero_absent_counts``).

The algorithm object is built at ``run()`` by the train model (``GRPOTrainModel.build_algorithm(cfg)``), after the
runner has placed and wrapped the model, so it holds the live (unwrapped) module; the loop keeps it
(``GRPOLoop.algorithm``) and rejects an object that lacks a stage, naming it. Precision is the train model's: the loop
enters the contexts it gets from ``rollout_context`` / ``update_context`` and imports nothing about autocast or adapter
dtypes.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from mmengine.dist import get_rank, get_world_size
from mmengine.logging import print_log
from mmengine.registry import LOOPS
from torch.utils.data import DataLoader

from ..grpo.protocol import (TRAIN_MODEL_METHODS, GRPOAlgorithm, GRPOTrainModel, check_algorithm,
                             check_stage_output, missing_train_model_methods)
from .atomic_files import read_pointer
from .checkpointing import unwrap_model
from .guard import StepGuard
from .iteration_loop import InfiniteBatches, IterationLoop
from .stats import (PhaseTimer, mean_of_logs, reduce_across_ranks, rollout_metrics, sum_across_ranks,
                    zero_absent_counts)

BATCHES_DRAWN = "grpo_batches_drawn"  # message-hub entry: prompt batches each rank took from its dataloader so far
EMPTY_BATCHES = "grpo_empty_batches"  # message-hub entry: run total of batches replaced for being empty


@LOOPS.register_module()
class GRPOLoop(IterationLoop):
    """Iteration-based GRPO training (``train_cfg=dict(type=GRPOLoop, max_iters=..., algorithm=dict(...))``).

    Args:
        runner: the MMEngine runner (injected by ``Runner.build_train_loop``).
        dataloader: prompts (``RegionSample`` batches), a DataLoader or its config.
        max_iters: number of GRPO iterations (one dataloader batch each).
        algorithm: config of the GRPO algorithm (a ``grpo.protocol.GRPOAlgorithm``), built by the train model's
            ``build_algorithm``.
        sft_dataloader: optional SFT batches (``sft_collate`` layout): each iteration adds the model's SFT loss on
            one of them, times ``sft_loss_weight``, to its first minibatch's loss (same backward, same step).
        sft_loss_weight: weight of the mixed-in SFT loss (> 0 when ``sft_dataloader`` is given).
        max_consecutive_skips: iterations in a row with a skipped optimizer step (NaN / inf gradient, or an
            update over ``max_update_ratio``) after which training stops with ``FloatingPointError``.
        max_update_ratio: largest ``||update|| / ||trainable weights||`` of an applied optimizer step; a larger one
            is undone and skipped (``StepGuard``). None: unchecked (no copy of the weights is kept).
        val_begin, val_interval, dynamic_intervals: as in MMEngine's ``IterBasedTrainLoop`` (``IterationLoop``).

    Hook points besides MMEngine's: ``after_rollout`` and ``after_reward`` (``runner.call_hook`` reaches every hook
    that defines the method). Gradient accumulation (``accumulative_counts``) counts ``train_step`` calls, i.e.
    minibatches; make the minibatches per iteration a multiple of it.
    """

    def __init__(self, runner, dataloader: DataLoader | dict, max_iters: int, algorithm: Mapping[str, Any],
                 sft_dataloader: DataLoader | dict | None = None, sft_loss_weight: float = 1.0,
                 max_consecutive_skips: int = 3, max_update_ratio: float | None = 1.0, val_begin: int = 1,
                 val_interval: int = 1000, dynamic_intervals=None) -> None:
        if not isinstance(algorithm, Mapping) or "type" not in algorithm:
            raise TypeError(f"GRPOLoop: train_cfg.algorithm must be a config dict with a 'type' (e.g. "
                            f"dict(type=CycleGRPO, ...)), got {algorithm!r}.")
        if sft_dataloader is not None and not sft_loss_weight > 0:
            raise ValueError(f"GRPOLoop: sft_loss_weight={sft_loss_weight} with an sft_dataloader; give a weight "
                             "> 0 (e.g. 0.1), or drop sft_dataloader to train without SFT mixing.")
        super().__init__(runner, dataloader, max_iters, val_begin, val_interval, dynamic_intervals)
        self._algorithm_cfg = algorithm  # kept as given: a ConfigDict resolves lazy `type=Class` on access
        self._algorithm = None
        self._guard = StepGuard(max_consecutive_skips, max_update_ratio)
        self.sft_loss_weight = float(sft_loss_weight)
        self._sft_iterator = None
        self._empty_draws: dict[str, float] = {"data/empty_batches": 0.0}
        if sft_dataloader is not None:
            self._sft_iterator = InfiniteBatches(self.build_dataloader(sft_dataloader))

    @property
    def algorithm(self) -> GRPOAlgorithm | None:
        """The GRPO algorithm (None until ``run()`` builds it); it owns the weight sets (``algorithm.weights``)."""
        return self._algorithm

    def _build_algorithm(self) -> GRPOAlgorithm:
        """``train_cfg.algorithm`` built by the train model, checked against ``GRPOAlgorithm``."""
        model = self._train_model()
        return check_algorithm(model.build_algorithm(self._algorithm_cfg), "GRPOLoop: train_cfg.algorithm")

    def _train_model(self) -> GRPOTrainModel:
        """The unwrapped train model, checked against ``GRPOTrainModel``."""
        model = unwrap_model(self.runner.model)
        missing = missing_train_model_methods(model)
        if missing:
            raise TypeError(f"GRPOLoop: the train model {type(model).__name__} has no {', '.join(missing)} "
                            f"(grpo.protocol.GRPOTrainModel needs {', '.join(TRAIN_MODEL_METHODS)}); train GRPO with "
                            "model=dict(type=Sa2VATrainModel, ...).")
        return model

    def run(self):
        """Build the algorithm, skip already-trained batches (resume), then iterate; returns the model."""
        self._algorithm = self._build_algorithm()
        self._count_minibatches_for_accumulation()
        with self._guard.installed(self.runner.optim_wrapper):
            # Skip before the hooks run: TrainStateHook restores the RNG streams in before_train_epoch, and
            # re-creating an exhausted DataLoader iterator here draws from them.
            self._skip_trained_batches()
            self.runner.call_hook("before_train")
            self.runner.call_hook("before_train_epoch")
            while self._iter < self._max_iters and not self.stop_training:
                self.runner.model.train()
                self.run_iter(self._next_batch())
                self.validate_if_due()
            self.runner.call_hook("after_train_epoch")
            self.runner.call_hook("after_train")
        return self.runner.model

    def run_iter(self, data_batch) -> None:
        """One GRPO iteration on one batch of prompts (see the module docstring)."""
        runner, algo, timer = self.runner, self._algorithm, PhaseTimer()
        self._guard.iteration = self._iter + 1
        runner.call_hook("before_train_iter", batch_idx=self._iter, data_batch=data_batch)
        model, optim_wrapper = unwrap_model(runner.model), runner.optim_wrapper
        with model.rollout_context(optim_wrapper):
            with timer("encode"):
                features = algo.encode(data_batch)
            with timer("rollout"):
                sampled = check_stage_output(algo.rollout(features), "rollout", algo)
        runner.call_hook("after_rollout", batch_idx=self._iter, data_batch=data_batch, rollouts=sampled.rollouts)
        with timer("score"):
            scored = check_stage_output(algo.score(sampled), "score", algo)
        runner.call_hook("after_reward", batch_idx=self._iter, data_batch=data_batch, rollouts=scored.rollouts)
        advantaged = check_stage_output(algo.compute_advantages(scored), "compute_advantages", algo)
        with timer("update"), model.update_context(optim_wrapper):
            step_logs = self._update(algo, advantaged)
        algo.after_optimizer_step()
        outputs = reduce_across_ranks({**step_logs, **rollout_metrics(advantaged.rollouts), **timer.seconds,
                                       **self._guard.end_iteration(), **self._empty_draws})
        outputs = zero_absent_counts(outputs, _logged_train_names(runner.message_hub))
        self._check_finite(outputs)
        runner.call_hook("after_train_iter", batch_idx=self._iter, data_batch=data_batch, outputs=outputs)
        self._iter += 1

    def _update(self, algo, advantaged) -> dict[str, float]:
        """One ``train_step`` per minibatch; the SFT batch (if any) rides on the first. Mean logs."""
        sft_batch = next(self._sft_iterator) if self._sft_iterator is not None else None
        logs = []
        for index, minibatch in enumerate(algo.minibatches(advantaged)):
            data = {"grpo_batch": minibatch, "algorithm": algo}
            if index == 0 and sft_batch is not None:
                data.update(sft_batch, sft_loss_weight=self.sft_loss_weight)
            logs.append(self.runner.model.train_step(data, optim_wrapper=self.runner.optim_wrapper))
        if not logs:
            raise ValueError(f"GRPOLoop: {type(algo).__name__}.minibatches() yielded nothing at iteration "
                             f"{self._iter}; it must yield at least one minibatch per iteration.")
        return mean_of_logs(logs)

    def _check_finite(self, outputs: dict[str, float]) -> None:
        """Log an iteration whose steps were skipped; raise after too many in a row (``StepGuard.check``)."""
        if not outputs.get("guard/skipped_steps"):
            return
        scalars = self.runner.message_hub.log_scalars  # OptimWrapper logs the clipped norm there
        if "train/grad_norm" in scalars:
            outputs = {**outputs, "grad_norm": scalars["train/grad_norm"].current()}
        warning = self._guard.check(outputs, read_pointer(self.runner.work_dir))
        if warning is not None:
            print_log(f"GRPOLoop: {warning}.", logger="current", level=logging.WARNING)

    def _next_batch(self):
        """This rank's next prompt batch. A batch that skipped bad samples left empty is replaced by this rank's
        next one, while the other ranks keep theirs (ranks stay in step on the iteration count); the replaced
        batches' skipped samples ride along for counting."""
        carried, empty, batch = [], 0, None
        for _ in range(_batches_per_epoch(self.dataloader) * get_world_size()):
            batch = next(self.dataloader_iterator)
            if not (hasattr(batch, "__len__") and len(batch) == 0):
                break
            carried += list(getattr(batch, "skipped", ()))
            empty, batch = empty + 1, None
        self._count_draws(drawn=empty + (batch is not None), empty=empty, gave_up=batch is None)
        if carried and hasattr(batch, "skipped"):
            batch.skipped = carried + list(batch.skipped)
        return batch

    def _count_draws(self, drawn: int, empty: int, gave_up: bool) -> None:
        """Record every rank's draws (one all-reduce): per-rank totals in the message hub (the checkpoint carries
        them), empty batches summed over ranks in the logged outputs; raise on every rank if one gave up."""
        world, rank, hub = get_world_size(), get_rank(), self.runner.message_hub
        counts = torch.zeros(2 * world + 1)  # [drawn per rank, gave up per rank, empty]
        counts[rank], counts[world + rank], counts[-1] = drawn, float(gave_up), empty
        counts = sum_across_ranks(counts)
        if counts[world:-1].any():
            ranks = [r for r in range(world) if counts[world + r] > 0]
            raise ValueError(f"GRPOLoop: iteration {self._iter + 1}: every prompt batch was empty on rank(s) {ranks} "
                             f"for {_batches_per_epoch(self.dataloader) * world} draws in a row (as many batches as "
                             "the whole dataset holds): every sample was skipped as bad. Check the dataset with "
                             "`sa2va-rl inspect CONFIG` (counts and the skipped-sample report) and fix the data or "
                             "its paths.")
        before = _drawn_per_rank(hub.get_info(BATCHES_DRAWN, self._iter), world)
        hub.update_info(BATCHES_DRAWN, [int(b + d) for b, d in zip(before, counts[:world].tolist())])
        hub.update_info(EMPTY_BATCHES, hub.get_info(EMPTY_BATCHES, 0) + int(counts[-1]))
        self._empty_draws = {"data/empty_batches": float(counts[-1])}
        if counts[-1]:
            print_log(f"GRPOLoop: iteration {self._iter + 1}: {int(counts[-1])} empty prompt batch(es) (every sample "
                      "skipped as bad) replaced by the next batch of the same rank "
                      f"({hub.get_info(EMPTY_BATCHES)} replaced in this run).", logger="current", level=logging.WARNING)

    def _count_minibatches_for_accumulation(self) -> None:
        """The runner sized the accumulation counter for one ``train_step`` per iteration; GRPO makes several
        and their number is not known ahead, so count without an end (MMEngine's max_counts=-1)."""
        optim_wrapper = self.runner.optim_wrapper
        if hasattr(optim_wrapper, "initialize_count_status"):  # DeepSpeed accumulates by itself
            optim_wrapper.initialize_count_status(unwrap_model(self.runner.model), 0, -1)

    def _skip_trained_batches(self) -> None:
        """Advance the dataloaders past what the resumed run consumed (empty batches it replaced included)."""
        if self._iter == 0:
            return
        drawn = _drawn_per_rank(self.runner.message_hub.get_info(BATCHES_DRAWN, self._iter), get_world_size())
        print_log(f"GRPOLoop: resumed at iteration {self._iter}; skipping the {drawn[get_rank()]} prompt batches "
                  "this rank already drew.", logger="current")
        for _ in range(drawn[get_rank()]):
            next(self.dataloader_iterator)
        for _ in range(self._iter if self._sft_iterator is not None else 0):
            next(self._sft_iterator)


def _batches_per_epoch(dataloader) -> int:
    """Batches in one epoch of this rank's loader (1000 for unsized loaders); ``_next_batch`` tolerates as many
    empty ones in a row as the whole dataset holds (this times the number of ranks)."""
    try:
        return max(1, len(dataloader))
    except TypeError:
        return 1000


def _drawn_per_rank(drawn: int | list[int], world: int) -> list[int]:
    """The message hub's per-rank draw counts; a single count (saved when every rank drew in step) holds for all."""
    if isinstance(drawn, int):
        return [drawn] * world
    if len(drawn) != world:
        raise ValueError(f"GRPOLoop: the resumed checkpoint was saved by {len(drawn)} processes and this run has "
                         f"{world}; each rank's data position is in the checkpoint, so resume with {len(drawn)} "
                         "processes, or start a new run from its weights (--cfg-options load_from=<checkpoint>, "
                         "without --resume).")
    return list(drawn)


def _logged_train_names(message_hub) -> list[str]:
    """Names logged at earlier iterations (``train/<name>`` scalars of the message hub, restored on resume)."""
    return [key[len("train/"):] for key in message_hub.log_scalars if key.startswith("train/")]
