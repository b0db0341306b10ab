"""demo/acceptance.py: the share of the oracle's cycle-IoU gain that GRPO recovers and the per-seed checks, from
evaluation runs on disk (fabricated here: known per-sample scores, so every number is known)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from projects.llava_sam2.rl_train.demo.acceptance import acceptance
from projects.llava_sam2.rl_train.demo.pipeline import DemoSettings
from projects.llava_sam2.rl_train.evaluation.metrics import summarize
from projects.llava_sam2.rl_train.evaluation.records import EvalRecord, MaskStats
from projects.llava_sam2.rl_train.evaluation.results import save_run
from projects.llava_sam2.rl_train.evaluation.tasks import TaskResult

N = 60


def mask_stats(iou: float) -> MaskStats:
    inter = int(round(iou * 10000))
    return MaskStats(True, 1, inter, 10000, inter, 10000)


def fake_run(path, cycle, meteor, gap=None):
    """An evaluation run with per-sample cycle IoU and caption METEOR; a text-dependence file when ``gap``."""
    results = {}
    for task, scores in (("cycle_iou", cycle), ("caption", meteor)):
        records = [EvalRecord(task, f"s/{i}#{i}", round(float(v), 4), mask=mask_stats(v) if task == "cycle_iou" else None)
                   for i, v in enumerate(scores)]
        results[task] = TaskResult(task, records, summarize(task, records, n_resamples=200))
    save_run(str(path), results, {"system": path.name})
    if gap is not None:
        scenes = [{"index": i, "own": 0.5 + g, "other": 0.5, "identical_pairs": 0, "pairs": 1, "objects": 2}
                  for i, g in enumerate(gap)]
        (path / "text_dependence.json").write_text(json.dumps({"scenes": scenes}))
    return path


@pytest.mark.parametrize("rl_gain, passes", [(0.06, True), (0.03, False)])
def test_recovered_share_and_checks(tmp_path, rl_gain, passes):
    rng = np.random.default_rng(0)
    start = rng.uniform(0.2, 0.5, N)
    meteor = rng.uniform(0.6, 0.7, N)
    gap = rng.uniform(0.1, 0.3, N)
    noise = rng.normal(0, 0.005, N)
    s = DemoSettings(tmp_path / "seed10", seed=10)
    fake_run(s.path("eval/base"), start, meteor, gap)
    fake_run(s.path("eval/rl"), start + rl_gain + noise, meteor, gap)
    oracle = fake_run(s.path("eval/controls/sft_more"), start + 0.10 + noise, meteor + 0.01)
    source = fake_run(s.path("eval/controls/source_sft"), start + noise, meteor - 0.05)
    lines, verdict = acceptance({10: s}, {10: {"sft_more": oracle, "source_sft": source}})
    seed = verdict["seeds"][10]
    assert seed["recovered"] == pytest.approx(rl_gain / 0.10, abs=0.01)
    assert seed["cycle_beyond_ci"] and seed["no_regression"] and seed["text_gap"] and seed["above_source_sft"]
    assert verdict["met"] is passes  # 60 % of the oracle's gain passes, 30 % does not
    assert any("Acceptance" in line for line in lines)


def test_a_metric_lower_beyond_ci_fails_its_check(tmp_path):
    rng = np.random.default_rng(1)
    start, meteor = rng.uniform(0.2, 0.5, N), rng.uniform(0.6, 0.7, N)
    s = DemoSettings(tmp_path / "seed11", seed=11)
    fake_run(s.path("eval/base"), start, meteor, rng.uniform(0.1, 0.3, N))
    fake_run(s.path("eval/rl"), start + 0.08, meteor - 0.05, np.zeros(N))  # captions and text gap worse
    oracle = fake_run(s.path("eval/controls/sft_more"), start + 0.10, meteor)
    source = fake_run(s.path("eval/controls/source_sft"), start + 0.09, meteor)
    _, verdict = acceptance({11: s}, {11: {"sft_more": oracle, "source_sft": source}})
    seed = verdict["seeds"][11]
    assert not seed["no_regression"] and not seed["text_gap"] and not seed["above_source_sft"]
    assert seed["cycle_beyond_ci"] and not verdict["met"]
