"""prompt_rl: quality-model metrics, calibration and baselines, the reward network and its GRPO reward, method
summaries and logit post-processing."""
import numpy as np
import pytest
import torch
from scipy import stats

from projects.llava_sam2.rl_train.prompt_rl.metrics import (
    IsotonicCalibrator, quality_metrics, quality_metrics_ci, stability_score)
from projects.llava_sam2.rl_train.prompt_rl.postprocess import apply_morphology
from projects.llava_sam2.rl_train.prompt_rl.quality_model import select_scorer
from projects.llava_sam2.rl_train.prompt_rl.reward_net import (
    RewardNet, RewardNetConfig, is_degenerate, make_inputs, predict_dice, save_reward_net, train_reward_net)


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # tiny tensors: a second thread only contends with other processes


# -------------------------------------------------------------------------------------------- metrics

def test_auroc_worked_example():
    # failures (dice < 0.5): scores 0.1, 0.6; successes: 0.4, 0.9.
    # pairs (failure < success): 0.1<0.4 yes, 0.1<0.9 yes, 0.6<0.4 no, 0.6<0.9 yes -> 3/4
    m = quality_metrics([0.1, 0.6, 0.4, 0.9], [0.2, 0.3, 0.7, 0.8])
    assert m["auroc"] == pytest.approx(0.75) and m["n_failures"] == 2
    tie = quality_metrics([0.5, 0.5], [0.2, 0.8])  # one tied pair counts one half
    assert tie["auroc"] == pytest.approx(0.5)
    # MAE: |0.1-0.2| + |0.6-0.3| + |0.4-0.7| + |0.9-0.8| = 0.8 -> 0.2
    assert m["mae"] == pytest.approx(0.2)


def test_correlations_match_scipy_and_undefined_cases_are_nan():
    rng = np.random.default_rng(0)
    d = rng.uniform(size=40)
    s = d + rng.normal(0, 0.3, size=40)
    m = quality_metrics(s, d)
    assert m["pearson"] == pytest.approx(stats.pearsonr(s, d)[0])
    assert m["spearman"] == pytest.approx(stats.spearmanr(s, d)[0])
    const = quality_metrics(np.full(40, 0.5), d)
    assert np.isnan(const["pearson"]) and np.isnan(const["spearman"])
    assert np.isnan(quality_metrics(s, np.full(40, 0.9))["auroc"])  # no failure: AUROC undefined
    with pytest.raises(ValueError, match="NaN"):
        quality_metrics([np.nan, 1.0], [0.1, 0.2])


def test_image_bootstrap_ci_brackets_the_estimate_and_is_seeded():
    rng = np.random.default_rng(1)
    d = rng.uniform(size=(30, 4))
    s = d + rng.normal(0, 0.2, size=d.shape)
    ci = quality_metrics_ci(s, d, n_resamples=200, seed=3)
    again = quality_metrics_ci(s, d, n_resamples=200, seed=3)
    for name, est in ci.items():
        assert est.low <= est.value <= est.high and est.n == 30, name
        assert est == again[name]
    assert ci["pearson"].value == pytest.approx(quality_metrics(s, d)["pearson"])
    assert np.isnan(quality_metrics_ci(np.full((30, 4), 0.3), d, n_resamples=50)["pearson"].low)


def test_isotonic_calibration_is_monotone_keeps_order_and_lowers_mae():
    rng = np.random.default_rng(2)
    raw = rng.uniform(size=300)
    dice = np.clip(raw ** 3 + rng.normal(0, 0.05, 300), 0, 1)  # raw score is monotone but miscalibrated
    cal = IsotonicCalibrator().fit(raw, dice)
    out = cal(raw)
    order = np.argsort(raw)
    assert (np.diff(out[order]) > 0).all()  # strictly increasing: the tie-break keeps the raw order
    assert np.abs(out - dice).mean() < 0.5 * np.abs(raw - dice).mean()
    assert quality_metrics(out, dice)["spearman"] == pytest.approx(quality_metrics(raw, dice)["spearman"])
    with pytest.raises(ValueError, match="fit"):
        IsotonicCalibrator()(raw)


def test_stability_score_hand_example():
    logits = np.array([[[3.0, 0.5], [-0.5, -3.0]], [[-5.0, -5.0], [-5.0, -5.0]]])
    # image 0: {x > 1} = 1 pixel, {x > -1} = 3 pixels -> 1/3; image 1: both empty -> 0
    np.testing.assert_allclose(stability_score(logits), [1 / 3, 0.0])


def test_scorer_selection_uses_the_network_only_if_it_beats_every_baseline():
    val = {"reward_net": {"spearman": 0.5}, "iou_head": {"spearman": 0.6}, "stability": {"spearman": 0.2}}
    assert select_scorer(val) == "iou_head"
    val["reward_net"]["spearman"] = 0.7
    assert select_scorer(val) == "reward_net"
    val["reward_net"]["spearman"] = float("nan")
    assert select_scorer(val) == "iou_head"


# ------------------------------------------------------------------------------------- reward network

def _synthetic(n, side=16, seed=0):
    """Square targets; the mask is the target shifted by s pixels, so Dice = 1 - s / 6 (6x6 squares)."""
    rng = np.random.default_rng(seed)
    images = np.full((n, side, side, 3), 100, np.uint8)
    masks = np.zeros((n, side, side), np.float32)
    dice = np.zeros(n)
    for i in range(n):
        r, c, s = rng.integers(1, 8), rng.integers(1, 4), rng.integers(0, 7)
        images[i, r:r + 6, c:c + 6] = (220, 40, 40)
        masks[i, r:r + 6, c + s:c + s + 6] = 1
        dice[i] = 1 - s / 6
    return make_inputs(images, masks), dice


def test_reward_net_learns_a_visible_quality_signal_with_nonzero_gradients():
    x, y = _synthetic(256)
    xv, yv = _synthetic(64, seed=1)
    config = RewardNetConfig(side=16, width=8)
    untrained = RewardNet(config)
    out = torch.sigmoid(untrained(x[:8]))
    torch.nn.functional.mse_loss(out, torch.as_tensor(y[:8], dtype=torch.float32)).backward()
    for name, p in untrained.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    net, log = train_reward_net(config, x, y, xv, yv, epochs=15, lr=5e-3, seed=0)
    assert log[-1]["train_mse"] < log[0]["train_mse"]
    pred = predict_dice(net, xv)
    assert quality_metrics(pred, yv)["spearman"] > 0.6
    assert min(e["val_mae"] for e in log) == pytest.approx(np.abs(pred - yv).mean(), abs=1e-4)


def test_degenerate_masks_get_the_documented_value():
    x, _ = _synthetic(4)
    x[0, 3] = 0.0  # empty mask
    x[1, 3] = 1.0  # full mask
    assert is_degenerate(x[:, 3].numpy()).tolist() == [True, True, False, False]
    net = RewardNet(RewardNetConfig(side=16, width=8, degenerate_value=0.0))
    pred = predict_dice(net, x)
    assert pred[0] == 0.0 and pred[1] == 0.0 and 0 < pred[2] < 1


def test_reward_net_config_validation():
    with pytest.raises(ValueError, match="mask_input"):
        RewardNetConfig(mask_input="logits")
    with pytest.raises(ValueError, match="multiple of 16"):
        RewardNetConfig(side=20)


def test_registered_grpo_reward_scores_masks_without_ground_truth(tmp_path):
    from PIL import Image

    from projects.llava_sam2.rl_train.prompt_rl.reward import RewardNetDiceReward
    from projects.llava_sam2.rl_train.rewards.base import REWARDS, RewardInputs, build_reward

    net = RewardNet(RewardNetConfig(side=16, width=8))
    save_reward_net(net, tmp_path)
    reward = build_reward(dict(type="reward_net_dice", checkpoint=str(tmp_path), weight=0.5))
    assert REWARDS["reward_net_dice"] is RewardNetDiceReward and reward.weight == 0.5
    image = Image.fromarray(np.full((32, 48, 3), 120, np.uint8))
    good = np.zeros((32, 48), bool)
    good[4:20, 8:30] = True
    inputs = RewardInputs(sample_ids=["a#0", "a#1", "a#2"], pred_masks=[good, None, np.zeros((32, 48), bool)],
                          gt_masks=None, images=[image] * 3)
    result = reward(inputs)
    assert result.values[1] is None and result.failures == {"no_mask": 1}
    assert result.values[2] == 0.0 and result.stats["degenerate"] == 1.0  # empty mask rule
    assert 0.0 < result.values[0] < 1.0
    x = make_inputs(np.asarray(image.resize((16, 16), Image.BOX))[None], np.zeros((1, 16, 16), np.float32))
    assert x.shape == (1, 4, 16, 16)
    with pytest.raises(ValueError, match="mask .* != image"):
        reward(RewardInputs(sample_ids=["a#0"], pred_masks=[good[:10]], images=[image]))
    with pytest.raises(ValueError, match="needs RewardInputs.images"):
        reward(RewardInputs(sample_ids=["a#0"], pred_masks=[good]))
    save_reward_net(RewardNet(RewardNetConfig(side=16, width=8, mask_input="binary+logits")), tmp_path / "logits")
    with pytest.raises(ValueError, match="only carry binary masks"):
        RewardNetDiceReward(tmp_path / "logits")
    with pytest.raises(ValueError, match="missing reward_net.pt"):
        RewardNetDiceReward(tmp_path / "nowhere")


# ------------------------------------------------------------------------- selection and post-processing

def test_method_summary_needs_the_baselines_and_pairs_differences():
    from projects.llava_sam2.rl_train.prompt_rl.quality_data import QualityData
    from projects.llava_sam2.rl_train.prompt_rl.selection import best_fixed_prompt, summarize_methods

    dice = np.array([[0.2, 0.6], [0.4, 0.5], [0.9, 0.1], [0.3, 0.7]])
    arrays = {m: dice for m in ("dice", "precision", "recall")}
    arrays["iou"] = np.array([[0.1, 0.4], [0.2, 0.3], [0.8, 0.05], [0.2, 0.5]])
    arrays["is_heldout"] = np.array([False, False, True, True])
    data = QualityData(arrays)
    assert best_fixed_prompt(data, np.array([0, 1])) == 1  # train means 0.3 vs 0.55
    rows = np.array([2, 3])
    choices = {"default": np.array([0, 0]), "best_fixed": np.array([1, 1]), "oracle": np.array([0, 1])}
    out = summarize_methods(data, rows, choices, n_resamples=50)
    assert out["oracle"]["dice"]["value"] == pytest.approx(0.8)  # (0.9 + 0.7) / 2
    assert out["best_fixed"]["dice_minus_default"]["value"] == pytest.approx(-0.2)  # (0.1 + 0.7 - 0.9 - 0.3) / 2
    assert out["best_fixed"]["iou_minus_default"]["value"] == pytest.approx(-0.225)  # (0.05 + 0.5 - 0.8 - 0.2) / 2
    assert out["oracle"]["iou_minus_best_fixed"]["value"] == pytest.approx(0.375)  # (0.8 + 0.5 - 0.05 - 0.5) / 2
    assert "iou_minus_default" not in out["default"]
    assert out["oracle"]["prompt_counts"] == [1, 1]
    with pytest.raises(ValueError, match="lack 'best_fixed'"):
        summarize_methods(data, rows, {"default": choices["default"]})
    with pytest.raises(ValueError, match="one prompt index"):
        summarize_methods(data, rows, {**choices, "bad": np.array([0, 2])})


def test_morphology_operations():
    mask = np.zeros((12, 12), bool)
    mask[2:8, 2:8] = True
    mask[4, 4] = False  # a one-pixel hole
    mask[10, 10] = True  # a one-pixel speck
    assert not apply_morphology(mask, "fill")[10, 10] is False and apply_morphology(mask, "fill")[4, 4]
    largest = apply_morphology(mask, "largest")
    assert not largest[10, 10] and largest[2, 2] and not largest[4, 4]
    assert apply_morphology(mask, "largest+fill")[4, 4] and not apply_morphology(mask, "open1")[10, 10]
    assert apply_morphology(mask, "close1")[4, 4]
    empty = np.zeros((5, 5), bool)
    assert not apply_morphology(empty, "largest+fill").any()
    with pytest.raises(ValueError, match="morphology"):
        apply_morphology(mask, "erode")


# ----------------------------------------------------------------------------------------------- report

def test_report_formatting_and_verdicts():
    from projects.llava_sam2.rl_train.prompt_rl.report import fmt, verdict

    est = dict(value=0.5, low=0.4, high=0.6, n=10)
    assert fmt(est) == "0.500 [0.400, 0.600]" and fmt(None) == "n/a"
    assert fmt(dict(value=float("nan"), low=float("nan"), high=float("nan"), n=3)) == "n/a"
    assert "better" in verdict(dict(value=0.1, low=0.05, high=0.2, n=10), "x")
    assert "worse" in verdict(dict(value=-0.1, low=-0.2, high=-0.05, n=10), "x")
    assert "no measurable difference" in verdict(dict(value=0.01, low=-0.02, high=0.04, n=10), "x")
    # a CI that excludes 0 only before rounding, or a negligible change, is no gain (the evaluation report's rule)
    assert "no measurable difference" in verdict(dict(value=0.001, low=0.0004, high=0.0014, n=200), "x")
    assert "no measurable difference" in verdict(dict(value=0.003, low=0.001, high=0.005, n=200), "x")


def test_checkpoint_comparison_needs_the_same_split():
    from projects.llava_sam2.rl_train.prompt_rl.quality_data import QualityData
    from projects.llava_sam2.rl_train.prompt_rl.report import compare_checkpoints

    dice = np.array([[0.2, 0.6], [0.4, 0.5], [0.9, 0.1], [0.3, 0.7]])
    meta = {"sample_ids": ["a/0#0", "a/1#1", "a/2#2", "a/3#3"], "prompt_labels": ["t0/e0", "t1/e0"]}
    base = QualityData({"dice": dice, "is_heldout": np.array([False, False, True, True])}, meta)
    tuned = QualityData({"dice": dice + 0.1, "is_heldout": base.is_heldout.copy()}, meta)
    out = compare_checkpoints(base, tuned, n_resamples=50)
    assert out["default prompt"]["tuned_minus_base"]["value"] == pytest.approx(0.1)
    assert out["best fixed prompt"]["base"]["value"] == pytest.approx(0.4)  # prompt 1 (train mean 0.55): (0.1+0.7)/2
    other = QualityData({"dice": dice, "is_heldout": np.array([True, False, False, True])}, meta)
    with pytest.raises(ValueError, match="--same-as"):
        compare_checkpoints(base, other)
