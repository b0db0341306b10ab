"""NonFiniteGuard: an optimizer step with a NaN / inf gradient is skipped, counted, and stops the run if it repeats.

Without it, one non-finite loss (an absurd learning rate, a degenerate batch, an SFT batch that overflows) turns
every trainable tensor, the EMA partner and every later checkpoint into NaN while the run goes on and exits 0.

The guard wraps the ``step`` of the torch optimizer the runner's optim wrapper drives (for DeepSpeed, the inner
optimizer ZeRO calls on its fp32 partition), so it works the same under ``OptimWrapper``, ``AmpOptimWrapper`` and
DeepSpeed, after DDP has averaged the gradients and after gradient clipping:

* gradients all finite (on every rank; one all-reduce of a flag)  -> the step runs;
* otherwise the step is skipped: weights and optimizer state (Adam moments, step count) stay as they were, the
  wrapper's ``zero_grad`` then drops the bad gradients. A non-finite loss always gives non-finite gradients.
* if a step that ran leaves a non-finite weight (finite gradients times an absurd learning rate), nothing can
  undo it without a copy of the weights, so the run stops at once with ``FloatingPointError``, before the
  partner update and the checkpoint of that iteration.

``GRPOLoop`` reads the per-iteration counts (``guard/skipped_steps``, ``guard/applied_steps`` in the logged
outputs; the EMA partner is not updated after an iteration in which no step ran) and stops the run with
``FloatingPointError`` after ``max_consecutive_nonfinite`` iterations in a row that skipped a step.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
from mmengine.dist import all_reduce, get_world_size
from torch import Tensor

from .mmengine_seams import carry_scheduler_mark


def all_finite(tensors: Iterable[Tensor | None]) -> bool:
    """True if no tensor holds a NaN or inf, on any rank (every rank must call this when distributed)."""
    flags = [torch.isfinite(t).all() for t in tensors if t is not None and t.numel()]
    is_finite = bool(torch.stack(flags).all()) if flags else True
    if get_world_size() > 1:
        flag = torch.tensor([float(is_finite)])
        all_reduce(flag, op="min")
        is_finite = bool(flag.item() > 0)
    return is_finite


def torch_optimizers(optim_wrapper) -> list[torch.optim.Optimizer]:
    """The torch optimizers behind an optim wrapper (``OptimWrapperDict``: each; DeepSpeed: ZeRO's inner one)."""
    wrappers = getattr(optim_wrapper, "optim_wrappers", None)
    if wrappers is not None:
        return [opt for wrapper in wrappers.values() for opt in torch_optimizers(wrapper)]
    optimizer = getattr(optim_wrapper, "optimizer", optim_wrapper)
    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"NonFiniteGuard: found no torch optimizer in {type(optim_wrapper).__name__}; the guard "
                        "wraps torch.optim.Optimizer.step.")
    return [optimizer]


class NonFiniteGuard:
    """Skip optimizer steps with non-finite gradients; count them per iteration (module docstring).

    Args:
        max_consecutive: iterations in a row with a skipped step after which ``check`` raises.
    """

    def __init__(self, max_consecutive: int = 3) -> None:
        if not isinstance(max_consecutive, int) or max_consecutive < 1:
            raise ValueError(f"max_consecutive_nonfinite={max_consecutive!r}; give a positive integer (e.g. 3): the "
                             "number of iterations in a row with a NaN/inf gradient after which training stops.")
        self.max_consecutive = max_consecutive
        self.skipped_steps = self.applied_steps = 0  # of the current iteration
        self.consecutive = 0  # iterations in a row with a skipped step
        self.iteration = 0  # 1-based, set by the loop, for messages

    def install(self, optim_wrapper) -> None:
        """Wrap ``step`` of every torch optimizer behind ``optim_wrapper`` (once per optimizer)."""
        for optimizer in torch_optimizers(optim_wrapper):
            if getattr(optimizer.step, "_nonfinite_guard", None) is self:
                continue
            guarded = functools.partial(self._guarded_step, optimizer, optimizer.step)
            guarded._nonfinite_guard = self
            carry_scheduler_mark(optimizer.step, guarded)
            optimizer.step = guarded

    def _guarded_step(self, optimizer: torch.optim.Optimizer, step, *args, **kwargs):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if not all_finite(p.grad for p in params):
            self.skipped_steps += 1
            return None
        out = step(*args, **kwargs)
        self.applied_steps += 1
        if not all_finite(params):
            raise FloatingPointError(
                f"iteration {self.iteration}: the optimizer step made trainable weights NaN or inf although the "
                "gradients were finite (learning rate far too high?). Weights cannot be restored in place; training "
                "stopped before this iteration's EMA update and checkpoint. Lower optim_wrapper.optimizer.lr, then "
                "resume from the newest complete checkpoint (sa2va-rl train CONFIG --resume auto).")
        return out

    def end_iteration(self) -> dict[str, float]:
        """This iteration's counts (``guard/skipped_steps``, ``guard/applied_steps``); resets them."""
        skipped, applied = self.skipped_steps, self.applied_steps
        self.skipped_steps = self.applied_steps = 0
        self.consecutive = self.consecutive + 1 if skipped else 0
        return {"guard/skipped_steps": float(skipped), "guard/applied_steps": float(applied)}

    def check(self, outputs: dict[str, float], last_checkpoint: str | None) -> str | None:
        """Raise ``FloatingPointError`` after ``max_consecutive`` bad iterations; else the warning to log (None if
        the iteration was clean)."""
        if not outputs.get("guard/skipped_steps"):
            return None
        values = ", ".join(f"{k}={outputs[k]:.4g}" for k in ("loss", "grad_norm") if k in outputs)
        status = (f"iteration {self.iteration}: {outputs['guard/skipped_steps']:g} optimizer step(s) skipped for a "
                  f"NaN/inf loss or gradient ({values or 'no loss logged'}); weights, optimizer state and EMA partner "
                  f"left unchanged; {self.consecutive} such iteration(s) in a row (limit {self.max_consecutive})")
        if self.consecutive >= self.max_consecutive:
            raise FloatingPointError(
                f"{status}. Training stopped. The newest complete checkpoint is {last_checkpoint or '(none yet)'}. "
                "Check the learning rate (optim_wrapper.optimizer.lr), clip_grad, the rewards and the data (an SFT "
                "batch mixed in counts too), then resume with sa2va-rl train CONFIG --resume auto; raise "
                "train_cfg.max_consecutive_nonfinite to tolerate longer runs of bad steps.")
        return status
