"""High-variance prompt pre-filter: keep the prompts whose GRPO group rewards vary.

A group whose G rewards are all equal has zero advantage everywhere, so its rollouts cost a full step of compute
and teach nothing. ``prefilter_prompts`` runs the training algorithm's group inference (encode → rollout → score,
no loss, no optimizer) over a dataset once, with the config's model, rewards and ``num_generations``, and records
per prompt and per loop the G rewards, their mean and their (population) standard deviation. A prompt is kept
for a loop when that std exceeds ``threshold``; ``keep_ids`` keeps a prompt when any active loop keeps it.

``sa2va-rl prefilter CONFIG --out prompts.json`` writes the result (``cli/prefilter.py``); a training config reads
it back with ``KeepIdsDataset`` around its dataset::

    train_dataloader.dataset = dict(type=KeepIdsDataset, dataset=coco_region_dataset,
                                    keep_ids_file='work_dirs/prompts.json')   # loop=None: any loop varies

The file (``FORMAT``)::

    {"format": "sa2va-rl prefilter 1", "threshold": 1e-6, "num_generations": G, "loops": [...],
     "num_prompts": n, "keep_ids": [...], "keep_ids_per_loop": {loop: [...]},
     "prompts": {sample_id: {loop: {"mean": m, "std": s, "rewards": [G values, null = unscored]}}}}
"""
from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from mmengine.logging import print_log
from mmengine.registry import DATASETS
from torch.utils.data import DataLoader, Dataset

from ..data.collate import region_collate
from .atomic_files import atomic_write_text
from .registry import build_component

FORMAT = "sa2va-rl prefilter 1"
DEFAULT_THRESHOLD = 1e-6  # above float noise of equal rewards, below any real spread of IoU / METEOR rewards


class PromptFileError(ValueError):
    """A keep-ids file that cannot be used: missing, not a prefilter file, or naming prompts the dataset lacks."""


def group_stats(rewards: Sequence[float]) -> dict[str, Any]:
    """Mean, population std and the values of one group's rewards (NaN = unscored, left out; < 2 scored: std 0)."""
    values = [float(r) for r in rewards]
    scored = torch.tensor([v for v in values if math.isfinite(v)], dtype=torch.float64)
    mean = float(scored.mean()) if len(scored) else float("nan")
    std = float(scored.std(unbiased=False)) if len(scored) >= 2 else 0.0
    return {"mean": mean, "std": std, "rewards": [v if math.isfinite(v) else None for v in values]}


def prefilter_prompts(algorithm, dataset: Dataset, *, batch_size: int, threshold: float = DEFAULT_THRESHOLD,
                      max_prompts: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Group inference over ``dataset`` (in order, ``batch_size`` prompts per step; bad samples the dataset skips
    are left out) and the kept ids; returns the file's content (module docstring)."""
    if batch_size < 1 or threshold < 0:
        raise ValueError(f"prefilter_prompts: batch_size={batch_size} must be >= 1 and threshold={threshold} >= 0.")
    from tqdm.auto import tqdm

    count = len(dataset) if max_prompts is None else min(max_prompts, len(dataset))
    indices = range(count)
    loader = DataLoader(torch.utils.data.Subset(dataset, indices), batch_size=batch_size, shuffle=False,
                        collate_fn=region_collate, num_workers=0)
    prompts: dict[str, dict[str, Any]] = {}
    loops: list[str] = []
    with tqdm(total=count, desc="prefilter: group inference", unit="prompt", disable=not progress) as bar:
        for batch in loader:
            if len(batch):
                scored = algorithm.score(algorithm.rollout(algorithm.encode(batch)))
                for rollout in scored.rollouts:
                    loops += [rollout.loop] if rollout.loop not in loops else []
                    for sample, rewards in zip(batch, rollout.rewards.tolist()):  # [B, G]
                        prompts.setdefault(sample.sample_id, {})[rollout.loop] = group_stats(rewards)
            bar.update(len(batch) + len(batch.skipped))
    per_loop = {loop: [sid for sid, stats in prompts.items() if loop in stats and stats[loop]["std"] > threshold]
                for loop in loops}
    keep = [sid for sid, stats in prompts.items() if any(s["std"] > threshold for s in stats.values())]
    return {"format": FORMAT, "threshold": threshold, "num_generations": algorithm.config.num_generations,
            "loops": loops, "num_prompts": len(prompts), "keep_ids": keep, "keep_ids_per_loop": per_loop,
            "prompts": prompts}


def write_prompt_file(path: str | os.PathLike, content: Mapping[str, Any]) -> None:
    """Write the prefilter result as JSON, atomically (a crash leaves the old file or none)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_text(os.fspath(path), json.dumps(content, indent=1) + "\n")


def read_keep_ids(path: str | os.PathLike, loop: str | None = None) -> list[str]:
    """The kept sample ids of a prefilter file: ``keep_ids`` (any loop), or ``keep_ids_per_loop[loop]``."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise PromptFileError(f"keep_ids_file {path!r} does not exist; write it with `sa2va-rl prefilter CONFIG "
                              f"--out {path}`.")
    try:
        with open(path, encoding="utf-8") as handle:
            content = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise PromptFileError(f"keep_ids_file {path!r} is not JSON ({err}); write it with `sa2va-rl prefilter`.") \
            from err
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        found = content.get("format") if isinstance(content, dict) else type(content).__name__
        raise PromptFileError(f"keep_ids_file {path!r} is not a prefilter file (format {found!r}, expected "
                              f"{FORMAT!r}); write it with `sa2va-rl prefilter`.")
    if loop is None:
        ids = content.get("keep_ids")
    else:
        per_loop = content.get("keep_ids_per_loop") or {}
        if loop not in per_loop:
            raise PromptFileError(f"keep_ids_file {path!r} has no loop {loop!r} (it has {sorted(per_loop)}); pass "
                                  "one of those or loop=None (any loop).")
        ids = per_loop[loop]
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise PromptFileError(f"keep_ids_file {path!r}: the kept ids must be a list of sample-id strings.")
    return ids


def _build(dataset: Any) -> Dataset:
    """A dataset object, or built from its config dict (``dict(type=<class or DATASETS name>, **kwargs)``)."""
    return build_component(DATASETS, dataset) if isinstance(dataset, Mapping) else dataset


def _sample_ids(dataset: Dataset) -> Iterable[str]:
    """Each index's sample id: ``dataset.sample_id(i)`` where the dataset has it (no image decode), else loaded."""
    sample_id = getattr(dataset, "sample_id", None)
    for index in range(len(dataset)):
        yield sample_id(index) if callable(sample_id) else getattr(dataset[index], "sample_id", None)


@DATASETS.register_module()
class KeepIdsDataset(Dataset):
    """The samples of ``dataset`` whose ids a prefilter file keeps, in the dataset's order.

    Args:
        dataset: a region dataset or its config dict.
        keep_ids_file: a ``sa2va-rl prefilter`` output.
        loop: None keeps the prompts whose rewards vary in any loop; a loop name (``mask_to_caption`` /
            ``caption_to_mask``) those of that loop.

    Raises ``PromptFileError`` for a missing or malformed file, a file that names ids the dataset does not hold
    (it was written for other data), or one that keeps nothing. Logs what it kept (counts) once, at construction.
    """

    def __init__(self, dataset: Any, keep_ids_file: str | os.PathLike, loop: str | None = None):
        self.dataset = _build(dataset)
        keep = read_keep_ids(keep_ids_file, loop)
        wanted = set(keep)
        ids = list(_sample_ids(self.dataset))
        self.indices = [index for index, sid in enumerate(ids) if sid in wanted]
        missing = sorted(wanted - set(ids))
        if missing:
            raise PromptFileError(f"keep_ids_file {os.fspath(keep_ids_file)!r} keeps {len(missing)} ids the dataset "
                                  f"does not hold (e.g. {missing[:3]}); it was written for other data. Run "
                                  "`sa2va-rl prefilter` on this config's dataset.")
        if not self.indices:
            raise PromptFileError(f"keep_ids_file {os.fspath(keep_ids_file)!r} keeps no prompt of the dataset (every "
                                  "group's rewards were equal); lower --threshold or train on the whole dataset.")
        self.summary = (f"KeepIdsDataset: kept {len(self.indices)} of {len(ids)} prompts "
                        f"({len(ids) - len(self.indices)} left out: equal group rewards"
                        f"{'' if loop is None else f' in loop {loop}'}) from {os.fspath(keep_ids_file)}")
        print_log(self.summary, logger="current", level=logging.INFO)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int):
        return self.dataset[self.indices[index]]

    def __getattr__(self, name: str):  # bad_samples, bad_sample_counts, name, ... of the wrapped dataset
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)
