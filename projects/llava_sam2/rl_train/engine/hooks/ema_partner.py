"""EMAPartnerHook: update the EMA partner after each training iteration, and checkpoint it.

The partner is the fp32 EMA shadow of the trainable tensors kept by ``grpo.weights.WeightSets``
(partner <- lerp(partner, policy, 1 - ema_decay); ``ema_decay`` is ``GRPOConfig.ema_decay``, default 0.999). The
hook owns only the timing and the checkpointing: unlike MMEngine's ``EMAHook`` it never deep-copies the model,
never averages frozen tensors, and saves its state itself, also under FlexibleRunner / DeepSpeed (docs/stack.md
§6, §7).

The weight sets are the algorithm's (grpo/protocol.py): the hook reads ``runner.train_loop.algorithm`` (a
``GRPOLoop``'s) and calls ``algorithm.weights.update_partner(algorithm.model)``. Priority ``NORMAL``: the update
runs before ``CheckpointHook`` (``VERY_LOW``), so a checkpoint saved at iteration k holds the partner after k
updates.

An iteration in which ``StepGuard`` skipped every optimizer step (``guard/applied_steps == 0`` in the loop's
outputs) leaves the policy unchanged, and the partner is left unchanged too (no update is counted).
"""
from __future__ import annotations

from typing import Any

from mmengine.registry import HOOKS

from ...grpo.protocol import GRPOAlgorithm
from ..checkpointing import StatefulHook
from ..loop import GRPOLoop


@HOOKS.register_module()
class EMAPartnerHook(StatefulHook):
    """``partner <- lerp(partner, policy, 1 - ema_decay)`` after every iteration's optimizer step(s)."""

    priority = "NORMAL"
    state_name = "ema_partner"

    def __init__(self) -> None:
        self._pending_state: dict[str, Any] | None = None

    @staticmethod
    def _algorithm(runner) -> GRPOAlgorithm:
        loop = runner.train_loop
        if not isinstance(loop, GRPOLoop) or loop.algorithm is None:
            raise ValueError(f"EMAPartnerHook: the train loop is a {type(loop).__name__} without a built GRPO "
                             "algorithm; the partner's weight sets belong to the algorithm, so use this hook with "
                             "train_cfg=dict(type=GRPOLoop, ...).")
        return loop.algorithm

    def before_train(self, runner) -> None:
        """Apply a resumed partner state (read before the weight sets existed)."""
        weights = self._algorithm(runner).weights
        if self._pending_state is not None:
            weights.load_state_dict(self._pending_state)
            self._pending_state = None

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if outputs is not None and outputs.get("guard/applied_steps", 1.0) == 0:
            return  # no optimizer step ran (non-finite gradients): the partner stays as it was
        algorithm = self._algorithm(runner)
        algorithm.weights.update_partner(algorithm.model)

    def state_dict(self, runner) -> dict[str, Any]:
        return self._algorithm(runner).weights.state_dict()

    def load_state_dict(self, runner, state: Any) -> None:
        self._pending_state = state
