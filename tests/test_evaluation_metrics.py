"""evaluation/metrics.py, bootstrap.py, records.py and captions.py: hand-computed values, CI behaviour."""
import math

import numpy as np
import pytest

from projects.llava_sam2.rl_train.evaluation.bootstrap import (
    Estimate, bootstrap_mean, bootstrap_ratio, paired_difference, paired_ratio_difference)
from projects.llava_sam2.rl_train.evaluation.captions import clean_sa2va, clean_tags, get_cleaner
from projects.llava_sam2.rl_train.evaluation.metrics import compare, get_metric, summarize
from projects.llava_sam2.rl_train.evaluation.records import (
    EvalRecord, MaskStats, align, read_records, write_records)
from projects.llava_sam2.rl_train.rewards.mask_metrics import ciou_giou


def _masks():
    """3 samples on a 2x4 grid: half right (IoU 1/2), exact (IoU 1), and no [SEG] (empty prediction)."""
    gt = [np.zeros((2, 4), bool) for _ in range(3)]
    gt[0][:, :2] = True             # 4 px
    gt[1][0, :2] = True             # 2 px
    gt[2][1, :] = True              # 4 px
    pred = [np.zeros((2, 4), bool), gt[1].copy(), None]
    pred[0][0, :2] = True           # 2 px inside gt[0]: ∩ 2, ∪ 4
    return pred, gt


def _res_records(pred, gt):
    records = []
    for i, (p, g) in enumerate(zip(pred, gt)):
        stats = MaskStats.from_masks(p, g, 0 if p is None else 1, keep_rle=True, sample_id=f"s/{i}#{i}")
        records.append(EvalRecord("res", f"s/{i}#{i}", stats.iou, mask=stats))
    return records


def test_res_aggregation_matches_hand_computed_and_upstream_accumulator():
    pred, gt = _masks()
    metrics = summarize("res", _res_records(pred, gt), n_resamples=200)
    # cIoU = Σ∩ / Σ∪ = (2 + 2 + 0) / (4 + 2 + 4): the no-[SEG] sample's 4 GT pixels stay in Σ∪ (Sa2VA RES.py)
    assert metrics["cIoU"].value == pytest.approx(0.4, abs=1e-9)
    # gIoU = mean(2/4, 2/2, 0) = 0.5 (upstream's +1e-5 in each denominator)
    assert metrics["gIoU"].value == pytest.approx((2 / (4 + 1e-5) + 2 / (2 + 1e-5) + 0) / 3, abs=1e-12)
    # the "skip no-[SEG]" reading: (2 + 2) / (4 + 2)
    assert metrics["cIoU_seg_only"].value == pytest.approx(4 / 6, abs=1e-9)
    assert metrics["no_seg_rate"].value == pytest.approx(1 / 3)
    assert metrics["cIoU"].n == 3 and metrics["cIoU"].low <= 0.4 <= metrics["cIoU"].high
    upstream = ciou_giou(pred, gt)  # rewards/mask_metrics: None counts as an empty prediction
    assert metrics["cIoU"].value == pytest.approx(upstream["cIoU"], abs=1e-12)
    assert metrics["gIoU"].value == pytest.approx(upstream["gIoU"], abs=1e-12)


def test_mask_stats_and_records_round_trip(tmp_path):
    pred, gt = _masks()
    records = _res_records(pred, gt)
    assert [r.mask.iou for r in records] == [0.5, 1.0, 0.0] and records[2].mask.rle is None
    assert MaskStats.from_masks(None, np.zeros((2, 2), bool), 0, keep_rle=False, sample_id="x").iou == 1.0
    with pytest.raises(ValueError, match="sample 'x'.*predicted mask"):
        MaskStats.from_masks(np.ones((3, 3), bool), gt[0], 1, keep_rle=False, sample_id="x")
    path = write_records(str(tmp_path / "r" / "res.jsonl"), records)
    assert read_records(path) == records
    with open(path, "a") as handle:
        handle.write("{not json\n")
    with pytest.raises(ValueError, match=r"res.jsonl:4: not valid JSON"):
        read_records(path)


def test_align_requires_the_same_samples():
    pred, gt = _masks()
    a = _res_records(pred, gt)
    b = list(reversed(_res_records(pred, gt)))
    left, right = align(a, b, "t")
    assert [r.sample_id for r in left] == [r.sample_id for r in right]
    with pytest.raises(ValueError, match=r"different samples \(1 only in the first"):
        align(a, b[:2], "t")


def test_bootstrap_ci_coverage_on_synthetic_data():
    """95% percentile CIs of a Bernoulli(0.3) mean (n = 200) cover the truth in ~95% of 200 seeded trials."""
    rng = np.random.default_rng(123)
    covered = 0
    for trial in range(200):
        values = rng.random(200) < 0.3
        est = bootstrap_mean(values, n_resamples=400, seed=trial)
        covered += est.low <= 0.3 <= est.high
    assert 0.89 <= covered / 200 <= 0.99
    # a ratio of sums (cIoU-like) with population ratio E[a] / E[b] = 2 / 5
    covered = 0
    for trial in range(100):
        b = rng.integers(1, 10, size=200)  # mean 5
        a = rng.binomial(b, 0.4)           # E[a | b] = 0.4 b
        est = bootstrap_ratio(a, b, n_resamples=400, seed=trial)
        covered += est.low <= 0.4 <= est.high
    assert 0.87 <= covered / 100 <= 1.0


def test_bootstrap_is_seeded_and_handles_edge_cases():
    values = np.random.default_rng(0).random(50)
    assert bootstrap_mean(values, seed=3) == bootstrap_mean(values, seed=3)
    assert bootstrap_mean(values, seed=3) != bootstrap_mean(values, seed=4)
    single = bootstrap_mean([0.7])
    assert single.value == 0.7 and math.isnan(single.low) and single.format() == "0.700"
    with pytest.raises(ValueError, match="no samples"):
        bootstrap_mean([])
    with pytest.raises(ValueError, match="non-finite"):
        bootstrap_mean([0.1, float("nan")])
    with pytest.raises(ValueError, match="confidence=1.5"):
        bootstrap_mean(values, confidence=1.5)
    assert Estimate.from_dict(single.to_dict()) == single


def test_paired_difference_detects_a_gain_that_unpaired_cis_miss():
    """System B = A + 0.03 on every sample, with large between-sample spread: the per-system CIs overlap, the
    paired difference CI excludes 0."""
    rng = np.random.default_rng(7)
    a = rng.random(200)
    b = np.clip(a + 0.03 + 0.01 * rng.standard_normal(200), 0, 1.5)
    ci_a, ci_b = bootstrap_mean(a), bootstrap_mean(b)
    assert ci_b.low < ci_a.high  # overlapping marginal CIs
    diff = paired_difference(b, a)
    assert diff.excludes_zero and diff.low > 0.02 and diff.value == pytest.approx(np.mean(b - a))
    same = paired_ratio_difference([1, 2, 3], [2, 4, 6], [1, 2, 3], [2, 4, 6])
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0) and not same.excludes_zero


def test_compare_records_of_two_systems():
    pred, gt = _masks()
    worse = _res_records([None, None, None], gt)
    better = _res_records(pred, gt)
    diff = compare("res", "cIoU", better, worse, n_resamples=200)
    assert diff.value == pytest.approx(0.4)
    assert compare("caption", "METEOR15_mean", [EvalRecord("caption", "a", 0.5)], [EvalRecord("caption", "a", 0.2)]) \
        is None  # no METEOR 1.5 scores in the records
    with pytest.raises(ValueError, match="has no metric 'mIoU'"):
        get_metric("res", "mIoU")


def test_caption_cleaning_rules():
    raw = "The region marked by region1 is a red circle.<|im_end|>"
    # region1 and the phrase go, then every 'is' (Sa2VA region_cap_refcocog_eval.py), then tags
    assert clean_sa2va(raw) == "a red circle."
    assert clean_sa2va("this island: shows\nred") == "th land red"  # 'is' inside words goes too (upstream)
    assert clean_tags("It is [SEG].<|im_end|>") == "It is ."
    with pytest.raises(ValueError, match="caption_cleaning='ptb'"):
        get_cleaner("ptb")
