"""StepGuard: an optimizer step that would wreck the weights is skipped, counted, and stops the run if it repeats.

Without it, one non-finite loss (a degenerate batch, an SFT batch that overflows) turns every trainable tensor, the
EMA partner and every later checkpoint into NaN while the run goes on and exits 0; and one step at an absurd learning
rate (finite loss and gradients, weights of 1e5 after it) is applied and checkpointed, so resuming from the newest
checkpoint cannot recover.

The guard wraps the ``step`` of the torch optimizer the runner's optim wrapper drives (for DeepSpeed, the inner
optimizer ZeRO calls on its fp32 partition), so it works the same under ``OptimWrapper``, ``AmpOptimWrapper`` and
DeepSpeed, after DDP has averaged the gradients and after gradient clipping. The wrapper is in place while the train
loop runs (``StepGuard.installed``); afterwards each optimizer's ``step`` is again what it was. Every decision is
taken from values reduced over the ranks, so all ranks skip or apply the same steps:

* a NaN / inf gradient on any rank -> the step is skipped (``nonfinite_gradient``); weights and optimizer state
  (Adam moments, step count) stay as they were, the wrapper's ``zero_grad`` then drops the bad gradients. A
  non-finite loss always gives non-finite gradients.
* ``max_update_ratio`` (default 1.0): the trainable weights and the optimizer state are copied before the step; if
  the step leaves a non-finite weight or moves the weights by more than ``max_update_ratio`` times their norm
  (``||w_after - w_before|| / ||w_before||`` over all trainable tensors of all ranks), the copy is put back and the
  step counts as skipped (``large_update``). Normal steps move the weights by about the learning rate (Adam), orders
  of magnitude below 1; ``guard/update_ratio`` logs the ratio of the applied steps. Weights whose norm is 0 (every
  trainable tensor zero-initialised) give no ratio and are checked for finiteness only.
* ``max_update_ratio=None`` keeps no copy: a step that made a weight non-finite cannot be undone, so the run stops
  at once with ``FloatingPointError``, before the partner update and the checkpoint of that iteration.

A gradient-norm spike is not a reason to skip: clipping bounds what a spike does to the weights (Adam's normalised
step does too), and with sparse rewards a running-median test fires on the first batch with a real signal; the
update ratio measures the change that actually reaches the weights.

``GRPOLoop`` reads the per-iteration counts (``guard/skipped_steps``, ``guard/applied_steps`` in the logged
outputs; the EMA partner is not updated after an iteration in which no step ran) and stops the run with
``FloatingPointError`` after ``max_consecutive_skips`` iterations in a row that skipped a step.
"""
from __future__ import annotations

import contextlib
import functools
import math
from collections import Counter
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor

from .mmengine_seams import carry_scheduler_mark, patched
from .stats import sum_across_ranks

NONFINITE_GRADIENT, LARGE_UPDATE = "nonfinite_gradient", "large_update"  # reasons a step is skipped


def sum_over_ranks(values: list[float]) -> list[float]:
    """Element-wise sum over the ranks (every rank must call it)."""
    return sum_across_ranks(torch.tensor(values, dtype=torch.float64)).tolist()


def all_finite(tensors: Iterable[Tensor | None]) -> bool:
    """True if no tensor holds a NaN or inf, on any rank (every rank must call this when distributed)."""
    flags = [torch.isfinite(t).all() for t in tensors if t is not None and t.numel()]
    is_finite = bool(torch.stack(flags).all()) if flags else True
    return sum_over_ranks([float(not is_finite)])[0] == 0


def torch_optimizers(optim_wrapper) -> list[torch.optim.Optimizer]:
    """The torch optimizers behind an optim wrapper (``OptimWrapperDict``: each; DeepSpeed: ZeRO's inner one)."""
    wrappers = getattr(optim_wrapper, "optim_wrappers", None)
    if wrappers is not None:
        return [opt for wrapper in wrappers.values() for opt in torch_optimizers(wrapper)]
    optimizer = getattr(optim_wrapper, "optimizer", optim_wrapper)
    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"StepGuard: found no torch optimizer in {type(optim_wrapper).__name__}; the guard "
                        "wraps torch.optim.Optimizer.step.")
    return [optimizer]


class _StepUndo:
    """A copy of the weights and the optimizer state of ``params`` taken before a step, to put back after it."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[Tensor]) -> None:
        self.optimizer, self.params = optimizer, params
        self.weights = [p.detach().clone() for p in params]
        self.states = {p: {k: v.clone() if torch.is_tensor(v) else v for k, v in optimizer.state[p].items()}
                       for p in params if p in optimizer.state}

    def update_ratio(self) -> tuple[bool, float]:
        """(weights all finite on every rank, ``||w_after - w_before|| / ||w_before||``; 0 when ``w_before`` is 0)."""
        # one device sync per sum; ``moved`` is NaN / inf when the step made a weight non-finite
        moved = sum(((p.detach().double() - w.double()).square().sum() for p, w in zip(self.params, self.weights)),
                    torch.zeros((), dtype=torch.float64)).item()
        size = sum((w.double().square().sum() for w in self.weights), torch.zeros((), dtype=torch.float64)).item()
        is_finite = math.isfinite(moved)  # every rank takes part below, also one without parameters (ZeRO)
        nonfinite, moved, size = sum_over_ranks([float(not is_finite), moved if is_finite else 0.0, size])
        return nonfinite == 0, (moved / size) ** 0.5 if size > 0 else 0.0

    @torch.no_grad()
    def restore(self) -> None:
        for param, weight in zip(self.params, self.weights):
            param.copy_(weight)
        for param in self.params:
            if param in self.states:
                self.optimizer.state[param] = self.states[param]
            else:
                self.optimizer.state.pop(param, None)


class StepGuard:
    """Skip optimizer steps with non-finite gradients or a destructive update; count them per iteration (module
    docstring).

    Args:
        max_consecutive: iterations in a row with a skipped step after which ``check`` raises.
        max_update_ratio: largest ``||update|| / ||weights||`` of an applied step; None: no check and no copy of
            the weights (a step that makes them non-finite then stops the run).
    """

    def __init__(self, max_consecutive: int = 3, max_update_ratio: float | None = 1.0) -> None:
        if not isinstance(max_consecutive, int) or max_consecutive < 1:
            raise ValueError(f"max_consecutive_skips={max_consecutive!r}; give a positive integer (e.g. 3): the "
                             "number of iterations in a row with a skipped optimizer step after which training "
                             "stops.")
        if max_update_ratio is not None and not (isinstance(max_update_ratio, (int, float)) and max_update_ratio > 0):
            raise ValueError(f"max_update_ratio={max_update_ratio!r}; give a number > 0 (e.g. 1.0: no step may move "
                             "the trainable weights by more than their own norm), or None to switch the check off.")
        self.max_consecutive, self.max_update_ratio = max_consecutive, max_update_ratio
        self.skipped: Counter[str] = Counter()  # reasons of the current iteration's skipped steps
        self.last_reasons: dict[str, int] = {}  # those of the iteration that ended last
        self.applied_steps = 0  # of the current iteration
        self.update_ratios: list[float] = []  # of the current iteration's steps (undone ones included)
        self.consecutive = 0  # iterations in a row with a skipped step
        self.iteration = 0  # 1-based, set by the loop, for messages

    @contextlib.contextmanager
    def installed(self, optim_wrapper) -> Iterator[None]:
        """Inside the block, ``step`` of every torch optimizer behind ``optim_wrapper`` runs through the guard; on
        leaving it (the end of training, or an error) each optimizer's ``step`` is again exactly what it was."""
        with contextlib.ExitStack() as stack:
            for optimizer in torch_optimizers(optim_wrapper):
                guarded = functools.partial(self._guarded_step, optimizer, optimizer.step)
                carry_scheduler_mark(optimizer.step, guarded)
                stack.enter_context(patched(optimizer, "step", guarded))
            yield

    def _guarded_step(self, optimizer: torch.optim.Optimizer, step, *args, **kwargs):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if not all_finite(p.grad for p in params):
            self.skipped[NONFINITE_GRADIENT] += 1
            return None
        undo = _StepUndo(optimizer, params) if self.max_update_ratio is not None else None
        out = step(*args, **kwargs)
        if undo is None:
            if not all_finite(params):
                raise FloatingPointError(
                    f"iteration {self.iteration}: the optimizer step made trainable weights NaN or inf although the "
                    "gradients were finite (learning rate far too high?). Weights cannot be restored in place with "
                    "train_cfg.max_update_ratio=None; training stopped before this iteration's EMA update and "
                    "checkpoint. Lower optim_wrapper.optimizer.lr, then resume from the newest complete checkpoint "
                    "(sa2va-rl train CONFIG --resume auto).")
        else:
            is_finite, ratio = undo.update_ratio()
            if not is_finite or ratio > self.max_update_ratio:
                undo.restore()
                self.skipped[LARGE_UPDATE] += 1
                self.update_ratios.append(ratio if is_finite else float("inf"))
                return None
            self.update_ratios.append(ratio)
        self.applied_steps += 1
        return out

    def end_iteration(self) -> dict[str, float]:
        """This iteration's counts (``guard/skipped_steps``, ``guard/applied_steps``) and the largest update ratio
        of its steps (``guard/update_ratio`` when the ratio is checked; NaN when no step got that far); resets them."""
        skipped = sum(self.skipped.values())
        stats = {"guard/skipped_steps": float(skipped), "guard/applied_steps": float(self.applied_steps)}
        if self.max_update_ratio is not None:
            stats["guard/update_ratio"] = max(self.update_ratios, default=float("nan"))
        self.last_reasons, self.skipped = dict(self.skipped), Counter()
        self.applied_steps, self.update_ratios = 0, []
        self.consecutive = self.consecutive + 1 if skipped else 0
        return stats

    def check(self, outputs: dict[str, float], last_checkpoint: str | None) -> str | None:
        """Raise ``FloatingPointError`` after ``max_consecutive`` bad iterations; else the warning to log (None if
        the iteration was clean)."""
        if not outputs.get("guard/skipped_steps"):
            return None
        values = ", ".join(f"{k}={outputs[k]:.4g}" for k in ("loss", "grad_norm", "guard/update_ratio")
                           if k in outputs)
        reasons = []
        if self.last_reasons.get(NONFINITE_GRADIENT):
            reasons.append(f"{self.last_reasons[NONFINITE_GRADIENT]} for a NaN/inf loss or gradient")
        if self.last_reasons.get(LARGE_UPDATE):
            reasons.append(f"{self.last_reasons[LARGE_UPDATE]} for an update larger than max_update_ratio="
                           f"{self.max_update_ratio:g} x the weights' norm, or non-finite weights")
        status = (f"iteration {self.iteration}: optimizer step(s) skipped: {'; '.join(reasons)} "
                  f"({values or 'no loss logged'}); weights, optimizer state and EMA partner left unchanged; "
                  f"{self.consecutive} such iteration(s) in a row (limit {self.max_consecutive})")
        if self.consecutive >= self.max_consecutive:
            raise FloatingPointError(
                f"{status}. Training stopped. The newest complete checkpoint is {last_checkpoint or '(none yet)'}. "
                "Check the learning rate (optim_wrapper.optimizer.lr), clip_grad, the rewards and the data (an SFT "
                "batch mixed in counts too), then resume with sa2va-rl train CONFIG --resume auto (a changed "
                "--cfg-options optim_wrapper.optimizer.lr=... applies on resume); raise "
                "train_cfg.max_consecutive_skips to tolerate longer runs of bad steps.")
        return status
