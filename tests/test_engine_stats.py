"""engine/stats.py across two gloo ranks: logged stats reduce over the union of the ranks' keys (a reward failure
seen on one rank only), counts are summed and other values averaged; ``sum_across_ranks`` sums element-wise."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from fault_tools import run_forked


def reduce_on_two_ranks(out_dir: str) -> None:
    import torch.distributed as dist

    from projects.llava_sam2.rl_train.engine.stats import reduce_across_ranks, sum_across_ranks

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    stats = {"loss": 1.0 + rank, "mask_to_caption/judge/failures/timeout": 3.0,
             "mask_to_caption/reward_mean": float("nan")}
    if rank == 1:
        stats.update({"mask_to_caption/judge/failures/http_500": 2.0, "mask_to_caption/meteor/missing": 1.0,
                      "extra": 4.0})
    summed = sum_across_ranks(torch.tensor([1.0, 2.0 * rank]))
    result = {"reduced": reduce_across_ranks(stats), "summed": summed.tolist()}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def test_reduce_across_ranks_takes_the_union_of_keys_sums_counts_and_averages_the_rest(tmp_path):
    assert run_forked(reduce_on_two_ranks, world=2, timeout=120, out_dir=str(tmp_path)) == [0, 0]
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert results[0] == results[1]
    reduced = results[0]["reduced"]
    assert reduced["loss"] == 1.5  # mean of 1 and 2
    assert reduced["mask_to_caption/judge/failures/timeout"] == 6.0  # counts add up
    assert reduced["mask_to_caption/judge/failures/http_500"] == 2.0
    assert reduced["mask_to_caption/meteor/missing"] == 1.0
    assert reduced["extra"] == 4.0  # a value only one rank has: its mean over the ranks that have it
    assert reduced["mask_to_caption/reward_mean"] != reduced["mask_to_caption/reward_mean"]  # NaN everywhere: NaN
    assert results[0]["summed"] == [2.0, 2.0]


def test_counts_logged_before_and_absent_now_are_zero_other_names_stay_absent():
    from projects.llava_sam2.rl_train.engine.stats import zero_absent_counts

    logged = ["loss", "sft_loss", "toy/judge/failures/http_500", "toy/judge/failures/timeout", "toy/total/invalid"]
    now = {"loss": 0.5, "toy/judge/failures/timeout": 2.0}
    assert zero_absent_counts(now, logged) == {"loss": 0.5, "toy/judge/failures/timeout": 2.0,
                                               "toy/judge/failures/http_500": 0.0, "toy/total/invalid": 0.0}
