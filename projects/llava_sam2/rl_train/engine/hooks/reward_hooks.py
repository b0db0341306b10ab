"""Reward accounting hooks (``after_reward``: the rollouts have been scored, advantages not yet computed).

``RewardFailureHook`` makes every reward fallback visible (docs/rewards.md): a judge timeout, an HTTP error or an
unparsable answer never stops training, but each iteration that had one logs a warning with the counts per loop,
reward and cause, and the run totals are kept in the message hub (``reward_failures``), which checkpoints carry
across a resume. The per-iteration counts are also in the logged metrics (``<loop>/<reward>/failures/<cause>``).

Standing causes (``STANDING_CAUSES``: a set-up state such as ``no_endpoint``, the same every iteration) are
counted the same way but not warned about each iteration: the reward says so once at start-up.
"""
from __future__ import annotations

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..stats import loop_names

FAILURE_MARK = "/failures/"  # RewardComposer's stats key: "<reward>/failures/<cause>"
STANDING_CAUSES = frozenset({"no_endpoint"})  # set-up states, logged once by the reward at start-up


def failure_counts(rollouts) -> dict[str, float]:
    """``{'<loop>/<reward>/failures/<cause>': count}`` of the non-zero failure counts of a scored step."""
    counts = {}
    for name, rollout in zip(loop_names(rollouts), rollouts):
        for key, value in rollout.reward_stats.items():
            if FAILURE_MARK in key and value:
                counts[f"{name}/{key}"] = float(value)
    return counts


@HOOKS.register_module()
class RewardFailureHook(Hook):
    """Warn about reward failures each iteration they happen; keep run totals in the message hub."""

    priority = "NORMAL"
    info_key = "reward_failures"

    def after_reward(self, runner, batch_idx: int, data_batch=None, rollouts=()) -> None:
        counts = failure_counts(rollouts)
        if not counts:
            return
        totals = dict(runner.message_hub.get_info(self.info_key) or {})
        for key, count in counts.items():
            totals[key] = totals.get(key, 0.0) + count
        runner.message_hub.update_info(self.info_key, totals)
        transient = {k: v for k, v in counts.items() if k.rsplit(FAILURE_MARK, 1)[1] not in STANDING_CAUSES}
        if not transient:
            return
        num_rollouts = sum(r.num_rollouts for r in rollouts)
        listed = ", ".join(f"{key}={count:g} (run total {totals[key]:g})" for key, count in sorted(transient.items()))
        runner.logger.warning(f"iteration {batch_idx + 1}: reward failures among {num_rollouts} rollouts: {listed}; "
                              "the affected rollouts fell back as the reward composer is configured.")
