"""An evaluation run on disk: ``metrics.json`` + ``records/<task>.jsonl``, and the dataset spec that
lets a report rebuild the same samples.

``metrics.json``::

    {"meta": {"system": ..., "model": {...}, "dataset": {<spec>}, "config": {...}},
     "tasks": {"<task>": {"n": N, "skipped": [...], "meteor15_corpus": float | null,
                          "records": "records/<task>.jsonl",
                          "metrics": {"<name>": {"value", "low", "high", "n", "confidence", "n_resamples"}}}}}

Dataset specs: ``{"kind": "shapes", "split", "seed", "num_samples", "image_size"}``,
``{"kind": "coco", "ann_file", "image_root", "name", "num_samples"}`` or (clips, every frame)
``{"kind": "mevis", "expression_file", "mask_file", "image_root", "name", "num_samples"}`` (``num_samples`` may be
null).
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from .bootstrap import Estimate
from .records import EvalRecord, read_records, write_records
from .tasks import TaskResult

METRICS_FILE = "metrics.json"
DATASET_KINDS = ("shapes", "coco", "mevis")


def save_run(out_dir: str, results: Mapping[str, TaskResult], meta: Mapping) -> str:
    """Write every task's records and the metrics file; returns the metrics file path."""
    os.makedirs(os.path.join(out_dir, "records"), exist_ok=True)
    tasks = {}
    for task, result in results.items():
        relative = os.path.join("records", f"{task}.jsonl")
        write_records(os.path.join(out_dir, relative), result.records)
        tasks[task] = {"n": len(result.records), "skipped": list(result.skipped),
                       "meteor15_corpus": result.meteor15_corpus, "records": relative,
                       "metrics": {name: est.to_dict() for name, est in result.metrics.items()}}
    path = os.path.join(out_dir, METRICS_FILE)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"meta": dict(meta), "tasks": tasks}, handle, indent=2, ensure_ascii=False)
    return path


@dataclass
class Run:
    """A saved evaluation run, loaded back.

    Attributes:
        path: the run directory; meta: ``metrics.json`` meta; results: task → TaskResult (records loaded).
    """

    path: str
    meta: dict
    results: dict[str, TaskResult]

    def records(self, task: str) -> list[EvalRecord]:
        if task not in self.results:
            raise ValueError(f"run {self.path} has no task {task!r} (it has {sorted(self.results)}); evaluate it "
                             "with --tasks including it")
        return self.results[task].records


def load_run(run_dir: str) -> Run:
    """Read ``run_dir/metrics.json`` and the records files it names."""
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"{run_dir}: no {METRICS_FILE}; pass a directory written by `sa2va-rl evaluate --out`")
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), dict):
        raise ValueError(f"{path}: expected {{'meta': ..., 'tasks': {{...}}}}; re-run `sa2va-rl evaluate`")
    results = {}
    for task, entry in data["tasks"].items():
        records = read_records(os.path.join(run_dir, entry["records"]))
        metrics = {name: Estimate.from_dict(value) for name, value in entry.get("metrics", {}).items()}
        results[task] = TaskResult(task, records, metrics, entry.get("meteor15_corpus"), list(entry.get("skipped", [])))
    return Run(run_dir, dict(data.get("meta", {})), results)


def build_dataset(spec: Mapping):
    """The dataset a spec describes (``ShapesWorld``, ``CocoRegionDataset`` or ``MeViSDataset``)."""
    kind = spec.get("kind") if isinstance(spec, Mapping) else None
    if kind == "shapes":
        from ..data.shapes import ShapesWorld

        return ShapesWorld(spec.get("split", "val"), int(spec["num_samples"]), int(spec.get("seed", 0)),
                           image_size=int(spec.get("image_size", 224)), domain=spec.get("domain", "source"),
                           shift=float(spec.get("shift", 1.0)))
    if kind == "coco":
        from ..data.coco import CocoRegionDataset

        return CocoRegionDataset(spec["ann_file"], spec.get("image_root"), name=spec.get("name", "coco"),
                                 on_bad_sample=spec.get("on_bad_sample", "raise"))
    if kind == "mevis":
        from ..data.video_formats.mevis import MeViSDataset

        return MeViSDataset(spec["expression_file"], spec["mask_file"], spec["image_root"],
                            name=spec.get("name", "mevis"), num_frames=None,
                            on_bad_sample=spec.get("on_bad_sample", "raise"))
    raise ValueError(f"dataset spec {dict(spec) if isinstance(spec, Mapping) else spec!r}: 'kind' must be one of "
                     f"{DATASET_KINDS}")
