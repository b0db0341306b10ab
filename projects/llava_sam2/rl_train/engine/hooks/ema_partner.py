"""EMAPartnerHook: update the EMA partner after each training iteration, and checkpoint it.

The partner is the fp32 EMA shadow of the trainable tensors kept by ``grpo.weights.WeightSets``
(partner <- lerp(partner, policy, 1 - ema_decay); ``ema_decay`` is ``GRPOConfig.ema_decay``, default 0.999). The
hook owns only the timing and the checkpointing: unlike MMEngine's ``EMAHook`` it never deep-copies the model,
never averages frozen tensors, and saves its state itself, also under FlexibleRunner / DeepSpeed (environment.md
facts 20-26).

The train model provides ``weights`` (the ``WeightSets``, built with the algorithm) and ``policy`` (the module
those weight sets pair with). Priority ``NORMAL``: the update runs before ``CheckpointHook`` (``VERY_LOW``), so a
checkpoint saved at iteration k holds the partner after k updates.

An iteration in which ``NonFiniteGuard`` skipped every optimizer step (``guard/applied_steps == 0`` in the loop's
outputs) leaves the policy unchanged, and the partner is left unchanged too (no update is counted).
"""
from __future__ import annotations

from typing import Any

from mmengine.registry import HOOKS

from ..checkpointing import StatefulHook, unwrap_model


@HOOKS.register_module()
class EMAPartnerHook(StatefulHook):
    """``partner <- lerp(partner, policy, 1 - ema_decay)`` after every iteration's optimizer step(s)."""

    priority = "NORMAL"
    state_name = "ema_partner"

    def __init__(self) -> None:
        self._pending_state: dict[str, Any] | None = None

    @staticmethod
    def _weight_sets(runner):
        model = unwrap_model(runner.model)
        weights = getattr(model, "weights", None)
        if weights is None:
            raise ValueError(f"EMAPartnerHook: {type(model).__name__}.weights is None; the partner's weight sets are "
                             "built with the GRPO algorithm, so use this hook with train_cfg=dict(type=GRPOLoop, "
                             "...) and a train model with build_algorithm (Sa2VATrainModel).")
        return model, weights

    def before_train(self, runner) -> None:
        """Apply a resumed partner state (read before the weight sets existed)."""
        _, weights = self._weight_sets(runner)
        if self._pending_state is not None:
            weights.load_state_dict(self._pending_state)
            self._pending_state = None

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if outputs is not None and outputs.get("guard/applied_steps", 1.0) == 0:
            return  # no optimizer step ran (non-finite gradients): the partner stays as it was
        model, weights = self._weight_sets(runner)
        weights.update_partner(model.policy)

    def state_dict(self, runner) -> dict[str, Any]:
        return self._weight_sets(runner)[1].state_dict()

    def load_state_dict(self, runner, state: Any) -> None:
        self._pending_state = state
