"""SkippedSampleHook: count the bad samples a run skipped (datasets with ``on_bad_sample='skip'``).

``region_collate`` moves a skipped sample out of the batch into ``batch.skipped``, so with DataLoader workers only
the main process sees them all (docs/data.md). This hook counts them there with ``data.BadSampleLog`` (distinct
sample ids per problem; the first few are logged as they come), keeps the running total in the logged metrics
(``data/skipped_samples``) and logs the per-problem report when training ends.
"""
from __future__ import annotations

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ...data.bad_samples import BadSampleLog


@HOOKS.register_module()
class SkippedSampleHook(Hook):
    """Count ``batch.skipped`` of every training batch; report at the end of training."""

    priority = "NORMAL"

    def __init__(self) -> None:
        self.log = BadSampleLog()

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        for skipped in getattr(data_batch, "skipped", ()):
            self.log.add(skipped, warn=True)
        runner.message_hub.update_scalar("train/data/skipped_samples", float(self.log.total))

    def after_train(self, runner) -> None:
        report = self.log.report("training data")
        (runner.logger.warning if self.log.total else runner.logger.info)(report)
