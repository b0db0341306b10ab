"""Cross-rank statistics (the CPU half of `check gpu`'s parity): the same global batch on 1 process and on
2 gloo processes gives the same loss and gradient norm at step 1, for every ``loss_type``.

``dapo`` divides by the active tokens of the *global* batch (TRL's ``num_items_in_batch / num_processes``); a
per-rank count makes the result depend on how the batch is split whenever ranks hold different token counts, which
the fixed batch here does (asserted). ``scale_rewards='batch'`` uses the global batch std, and the logged reward
metrics are global. ``bnpo`` normalises by each rank's own tokens by definition (TRL: "normalization is performed
over the local batch only"), so it is expected to differ. Runs engine/parity.py (what `sa2va-rl check gpu` runs on
GPUs) under torchrun with 2 gloo processes; rank 0 first trains alone, without a process group, as a 1-GPU run does.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from projects.llava_sam2.rl_train.engine.parity import LOCAL_BY_DEFINITION, compare, launch
from projects.llava_sam2.rl_train.grpo.losses import LOSS_AGGREGATIONS

REPO = Path(__file__).resolve().parents[1]
CASES = [pytest.param(f"{name}/group", marks=pytest.mark.xfail(strict=True, reason=LOCAL_BY_DEFINITION[name]))
         if name in LOCAL_BY_DEFINITION else f"{name}/group" for name in LOSS_AGGREGATIONS] + ["grpo/batch"]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[int, dict]:
    """World size -> case -> stats, from one 2-process torchrun launch (rank 0 also runs the single process)."""
    path = tmp_path_factory.mktemp("parity") / "results.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PARITY_WATCHDOG_S": "500"}
    code = launch(path, 2, [], path.with_suffix(".log"), env, timeout_s=600)
    assert code == 0, path.with_suffix(".log").read_text()[-5000:]
    return {int(world): cases for world, cases in json.loads(path.read_text()).items()}


@pytest.mark.parametrize("case", CASES)
def test_one_and_two_processes_give_the_same_loss_and_grad_norm(results, case):
    one, two = results[1][case], results[2][case]
    caption_tokens = [rank[0] for rank in two["active_tokens"]]  # mask_to_caption's, per rank
    assert caption_tokens[0] != caption_tokens[1], "the ranks must hold different token counts for the test to bite"
    assert one["grad_norm"] > 0
    for key in ("loss", "grad_norm", "mask_to_caption/pg_term", "caption_to_mask/pg_term"):
        assert two[key] == pytest.approx(one[key], rel=2e-5, abs=1e-7), key


def test_logged_rollout_metrics_are_those_of_the_global_batch(results):
    one, two = results[1]["grpo/group"], results[2]["grpo/group"]
    for loop in ("mask_to_caption", "caption_to_mask"):
        for stat in ("reward_mean", "reward_std", "frac_reward_zero_std", "frac_unscored", "completion_length"):
            key = f"{loop}/{stat}"
            assert two[key] == pytest.approx(one[key], rel=1e-6, abs=1e-9), key


def test_the_check_commands_verdict_agrees(results):
    """`sa2va-rl check gpu` judges parity with engine.parity.compare: every case passes (bnpo is reported only)."""
    rows = compare({str(world): cases for world, cases in results.items()}, rel=2e-5)
    assert [row["case"] for row in rows] == [f"{name}/group" for name in LOSS_AGGREGATIONS] + ["grpo/batch"]
    assert all(row["ok"] for row in rows), rows
    assert [row["expected_equal"] for row in rows].count(False) == len(LOCAL_BY_DEFINITION)
