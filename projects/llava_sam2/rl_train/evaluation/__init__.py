"""Held-out evaluation: RES (cIoU/gIoU), region captions (METEOR), the two cycle tasks and their video forms,
bootstrap CIs, reports and plots (docs/evaluation.md).

Public names resolve lazily (PEP 562): importing ``evaluation.bootstrap`` alone does not load torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "Estimate": ".bootstrap",
    "bootstrap_mean": ".bootstrap",
    "bootstrap_ratio": ".bootstrap",
    "paired_difference": ".bootstrap",
    "paired_ratio_difference": ".bootstrap",
    "EvalRecord": ".records",
    "MaskStats": ".records",
    "read_records": ".records",
    "write_records": ".records",
    "METRICS": ".metrics",
    "TASKS": ".metrics",
    "VIDEO_TASKS": ".metrics",
    "compare": ".metrics",
    "summarize": ".metrics",
    "EvalConfig": ".tasks",
    "TaskResult": ".tasks",
    "evaluate": ".tasks",
    "evaluate_caption": ".tasks",
    "evaluate_cycle_caption": ".tasks",
    "evaluate_cycle_iou": ".tasks",
    "evaluate_res": ".tasks",
    "evaluate_video": ".video_cycle_tasks",
    "Run": ".results",
    "build_dataset": ".results",
    "load_run": ".results",
    "save_run": ".results",
    "load_system": ".loading",
    "load_weights": ".loading",
    "write_report": ".report",
    "evaluate_video_res": ".video_tasks",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
