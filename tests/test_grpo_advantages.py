"""grpo/advantages.py: group-normalised advantages against hand-computed values, NaN / inf rewards, constant groups,
the global batch std."""
import math

import pytest
import torch

from projects.llava_sam2.rl_train.grpo.advantages import (
    ADVANTAGE_EPS, SCALE_REWARDS, group_advantages, reward_moments, rewards_to_tensor, std_from_moments)

NAN = float("nan")


def test_group_scaling_hand_values():
    # group 0: [1, 2, 3], mean 2, unbiased std sqrt(((-1)^2 + 0 + 1^2) / 2) = 1 -> A = [-1, 0, 1] / (1 + eps)
    # group 1: [0, 0, 0], zero spread -> A = 0 exactly (no 0 / eps noise)
    rewards = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    advantages, stats = group_advantages(rewards, "group")
    expected = torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]) / torch.tensor([1 + ADVANTAGE_EPS] * 3 + [1.0] * 3)
    torch.testing.assert_close(advantages, expected)
    assert stats["frac_reward_zero_std"] == 0.5
    assert stats["reward_mean"] == pytest.approx(1.0)  # (1 + 2 + 3 + 0 + 0 + 0) / 6
    assert stats["frac_unscored"] == 0.0


def test_batch_scaling_uses_group_mean_and_batch_std():
    # group means [2, 2]; batch [1, 3, 2, 2]: mean 2, squared deviations 1 + 1 + 0 + 0 = 2, var 2 / 3
    # A = (r - group mean) / (sqrt(2/3) + eps) = [-1, 1, 0, 0] / 0.81660
    rewards = torch.tensor([[1.0, 3.0], [2.0, 2.0]])
    advantages, _ = group_advantages(rewards, "batch")
    s = math.sqrt(2.0 / 3.0) + ADVANTAGE_EPS
    torch.testing.assert_close(advantages, torch.tensor([-1.0 / s, 1.0 / s, 0.0, 0.0]))


def test_no_scaling_is_centred_rewards():
    # Dr. GRPO: A = r - group mean = [1 - 2, 3 - 2] = [-1, 1], no division
    advantages, _ = group_advantages(torch.tensor([[1.0, 3.0]]), "none")
    torch.testing.assert_close(advantages, torch.tensor([-1.0, 1.0]))


def test_nan_rewards_drop_out_of_the_baseline_and_get_zero_advantage():
    # valid [1, 3, 5]: mean 3, unbiased std sqrt((4 + 0 + 4) / 2) = 2 -> A = [-1, 0(NaN), 0, 1] * 2 / (2 + eps)
    rewards = torch.tensor([[1.0, NAN, 3.0, 5.0]])
    advantages, stats = group_advantages(rewards, "group")
    torch.testing.assert_close(advantages, torch.tensor([-2.0, 0.0, 0.0, 2.0]) / (2.0 + ADVANTAGE_EPS))
    assert stats["frac_unscored"] == 0.25
    assert stats["reward_mean"] == pytest.approx(3.0)


def test_infinite_rewards_count_as_unscored():
    # an inf reward (a broken reward source) must not poison the group mean: same as NaN above
    rewards = torch.tensor([[1.0, float("inf"), 3.0, 5.0], [float("-inf"), 0.0, 1.0, 2.0]])
    advantages, stats = group_advantages(rewards, "group")
    assert torch.isfinite(advantages).all() and advantages[1] == 0 and advantages[4] == 0
    torch.testing.assert_close(advantages[[0, 2, 3]], torch.tensor([-2.0, 0.0, 2.0]) / (2.0 + ADVANTAGE_EPS))
    assert stats["frac_unscored"] == 0.25


def test_batch_std_of_the_global_batch_is_passed_in():
    # two ranks' halves of the batch of test_batch_scaling_uses_group_mean_and_batch_std: the sums of
    # reward_moments over the halves give the whole batch's std sqrt(2/3), which each half then uses
    halves = [torch.tensor([[1.0, 3.0]]), torch.tensor([[2.0, 2.0], [NAN, 7.0]])]
    moments = reward_moments(halves[0]) + reward_moments(halves[1])  # count 5, sum 15, sum of squares 67
    torch.testing.assert_close(moments, torch.tensor([5.0, 15.0, 67.0], dtype=torch.float64))
    std = std_from_moments(moments)  # sqrt((67 - 225 / 5) / 4) = sqrt(5.5)
    assert float(std) == pytest.approx(math.sqrt(5.5))
    advantages, _ = group_advantages(halves[0], "batch", batch_std=std)
    s = math.sqrt(5.5) + ADVANTAGE_EPS
    torch.testing.assert_close(advantages, torch.tensor([-1.0 / s, 1.0 / s]))
    assert float(std_from_moments(reward_moments(torch.tensor([[NAN, 1.0]])))) == 0.0  # fewer than 2 values


@pytest.mark.parametrize("scale_rewards", sorted(SCALE_REWARDS))
def test_unscored_and_constant_groups_never_produce_nan(scale_rewards):
    # group 0 all NaN, group 1 a single valid reward, group 2 constant, group 3 informative
    rewards = torch.tensor([[NAN, NAN], [0.7, NAN], [0.4, 0.4], [0.0, 1.0]])
    advantages, stats = group_advantages(rewards, scale_rewards)
    assert not torch.isnan(advantages).any()
    assert torch.equal(advantages[:6], torch.zeros(6))  # no learning signal in the first three groups
    assert advantages[6] < 0 < advantages[7]
    assert stats["frac_reward_zero_std"] == 0.75  # groups 0, 1 and 2
    assert stats["frac_unscored"] == 3 / 8


@pytest.mark.parametrize("scale_rewards", sorted(SCALE_REWARDS))
def test_equal_rewards_give_exactly_zero_advantage_despite_fp32_rounding(scale_rewards):
    # the fp32 mean of eight equal 0.3 / 0.7 / 0.8737 is off by an ulp: a std-based test saw spread there
    rewards = torch.tensor([[0.3] * 8, [0.7] * 8, [0.8737] * 8, [0.3] * 7 + [NAN], [0.3] * 7 + [0.3000001]])
    advantages, stats = group_advantages(rewards, scale_rewards)
    assert torch.equal(advantages[:32], torch.zeros(32))
    assert stats["frac_reward_zero_std"] == pytest.approx(0.8)  # a real difference, however small, is still signal
    assert advantages[32:].abs().sum() > 0


@pytest.mark.parametrize("scale_rewards", sorted(SCALE_REWARDS))
def test_equal_rewards_give_exactly_zero_even_when_float32_rounds_the_mean(scale_rewards):
    # [0.3] * 6: the float32 group mean is off by one ulp, its std ~3e-8 is not isclose(0) (atol 1e-8), and the
    # std + 1e-4 divisor made that rounding an advantage of ~3e-4; a group that really differs keeps its sign
    rewards = torch.tensor([[0.3] * 6, [0.3] * 5 + [0.3 + 1e-6]])
    advantages, stats = group_advantages(rewards, scale_rewards)
    assert torch.equal(advantages[:6], torch.zeros(6))
    assert (advantages[6:11] < 0).all() and advantages[11] > 0
    assert stats["frac_reward_zero_std"] == 0.5


def test_rewards_to_tensor_maps_none_to_nan_in_group_layout():
    rewards = rewards_to_tensor([0.5, None, 1.0, 0.0], group_size=2)
    assert rewards.shape == (2, 2)
    assert torch.isnan(rewards[0, 1]) and rewards[1, 0] == 1.0
    with pytest.raises(ValueError, match="multiple of num_generations"):
        rewards_to_tensor([0.5, 1.0, 0.0], group_size=2)


def test_bad_inputs_raise_with_the_fix():
    with pytest.raises(ValueError, match="scale_rewards='std'"):
        group_advantages(torch.zeros(2, 2), "std")
    with pytest.raises(ValueError, match="G >= 2"):
        group_advantages(torch.zeros(4, 1), "group")
