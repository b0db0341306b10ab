"""SkippedSampleHook: count the bad samples a run skipped (datasets with ``on_bad_sample='skip'``).

``region_collate`` moves a skipped sample out of the batch into ``batch.skipped``, so with DataLoader workers only
the main process sees them all (docs/data.md). This hook counts them there with ``data.BadSampleLog`` (distinct
sample ids per problem; the first few are logged as they come), keeps the running total in the logged metrics
(``data/skipped_samples``) and logs the per-problem report when training ends. With several processes every rank
gathers the skipped samples of all ranks each iteration, so the total and the report cover the whole run.
"""
from __future__ import annotations

from mmengine.dist import all_gather_object, get_world_size
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
        skipped = list(getattr(data_batch, "skipped", ()))
        if get_world_size() > 1:
            skipped = [sample for rank_skipped in all_gather_object(skipped) for sample in rank_skipped]
        for sample in skipped:
            self.log.add(sample, warn=True)
        runner.message_hub.update_scalar("train/data/skipped_samples", float(self.log.total))

    def after_train(self, runner) -> None:
        report = self.log.report("training data")
        (runner.logger.warning if self.log.total else runner.logger.info)(report)
