"""grpo/losses.py (+ config.py, rollout.py validation): clipped objective, k3 KL and the four normalisations
against hand-computed values on 2-4 element tensors."""
import math
import subprocess
import sys

import pytest
import torch

from projects.llava_sam2.rl_train.grpo.config import GRPOConfig
from projects.llava_sam2.rl_train.grpo.losses import (
    LOSS_AGGREGATIONS, PolicyLoss, clipped_objective, kl_k3)
from projects.llava_sam2.rl_train.grpo.rollout import CaptionReplay, Rollout

LN2 = math.log(2.0)


def make_rollout(old_logp, ref_logp=None, advantages=None, action_mask=None, is_truncated=None,
                 max_action_length=4):
    N, T = old_logp.shape
    ids = torch.zeros(N, T, dtype=torch.long)
    replay = CaptionReplay(prompt_ids=ids, prompt_attention=ids.bool(), completion_ids=ids,
                           image_index=torch.zeros(N, dtype=torch.long))
    return Rollout(
        group_size=2, old_logp=old_logp, ref_logp=ref_logp,
        action_mask=torch.ones(N, T, dtype=torch.bool) if action_mask is None else action_mask,
        rewards=torch.zeros(N // 2, 2), is_truncated=torch.zeros(N, dtype=torch.bool) if is_truncated is None
        else is_truncated, max_action_length=max_action_length, replay=replay, advantages=advantages)


def test_kl_k3_hand_values():
    # delta = ref - logp: ln 2 -> 2 - ln 2 - 1 = 0.306853; -ln 2 -> 0.5 + ln 2 - 1 = 0.193147; 0 -> 0
    logp = torch.tensor([0.0, 0.0, -1.0])
    ref = torch.tensor([LN2, -LN2, -1.0])
    torch.testing.assert_close(kl_k3(logp, ref), torch.tensor([1.0 - LN2, LN2 - 0.5, 0.0]))


def test_clipping_on_both_sides_hand_values_and_gradients():
    # epsilon 0.2 -> low bound 0.8, epsilon_high 0.28 -> high bound 1.28
    # A=+1, r=1.5: min(1.5, 1.28)   = 1.28 -> loss -1.28 (clipped high, no gradient)
    # A=+1, r=0.5: min(0.5, 0.8)    = 0.5  -> loss -0.5  (low clip does not bind for A > 0)
    # A=-1, r=0.5: min(-0.5, -0.8)  = -0.8 -> loss  0.8  (clipped low, no gradient)
    # A=-1, r=1.5: min(-1.5, -1.28) = -1.5 -> loss  1.5  (pessimistic side, unclipped)
    ratios = torch.tensor([[1.5, 0.5], [0.5, 1.5]])
    old_logp = torch.full((2, 2), -1.0)
    logp = (old_logp + ratios.log()).requires_grad_(True)
    pg_loss, ratio, clipped = clipped_objective(logp, old_logp, torch.tensor([1.0, -1.0]),
                                                epsilon=0.2, epsilon_high=0.28)
    torch.testing.assert_close(pg_loss, torch.tensor([[-1.28, -0.5], [0.8, 1.5]]))
    torch.testing.assert_close(clipped, torch.tensor([[1.28, 0.8], [0.8, 1.28]]))
    pg_loss.sum().backward()
    # d(-A r)/dlogp = -A r on unclipped elements, 0 where the clip binds
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.5], [0.0, 1.5]]))


# Shared hand example: B=1, G=2, T=2, beta=0.1, epsilon 0.2 / 0.28, advantages [+1, -1],
# ratios [[1.5, 0.9], [0.5, (masked)]], ref = logp + ln 2 everywhere -> kl = 1 - ln 2 = 0.306853 per element.
#   pg: row 0: -1.28 (clipped high), -0.9;  row 1: +0.8 (clipped low)
#   per_token = pg + 0.1 * 0.306853 = pg + 0.0306853
#   active sum = -1.28 - 0.9 + 0.8 + 3 * 0.0306853 = -1.2879441 over 3 active elements
KL = 1.0 - LN2
ACTIVE_SUM = -1.28 - 0.9 + 0.8 + 3 * 0.1 * KL
EXPECTED_LOSS = {
    "grpo": ((-1.28 - 0.9) / 2 + 0.1 * KL + 0.8 + 0.1 * KL) / 2,  # row means -1.059315, 0.830685 -> -0.114315
    "bnpo": ACTIVE_SUM / 3,  # -0.429315
    "dr_grpo": ACTIVE_SUM / (2 * 4),  # N * max_action_length = 8 -> -0.160993
    "dapo": ACTIVE_SUM / 3,  # local active count when no global count is given
}

EXPECTED_PG = {"grpo": ((-1.28 - 0.9) / 2 + 0.8) / 2, "bnpo": (-1.28 - 0.9 + 0.8) / 3,
               "dr_grpo": (-1.28 - 0.9 + 0.8) / 8, "dapo": (-1.28 - 0.9 + 0.8) / 3}


def hand_example(**overrides):
    old_logp = torch.full((2, 2), -1.0)
    logp = (old_logp + torch.tensor([[1.5, 0.9], [0.5, 1.0]]).log()).requires_grad_(True)
    rollout = make_rollout(old_logp, ref_logp=(logp + LN2).detach(), advantages=torch.tensor([1.0, -1.0]),
                           action_mask=torch.tensor([[True, True], [True, False]]), **overrides)
    return logp, rollout


def test_every_loss_type_has_a_hand_value():
    assert set(EXPECTED_LOSS) == set(LOSS_AGGREGATIONS)


@pytest.mark.parametrize("loss_type", sorted(LOSS_AGGREGATIONS))
def test_policy_loss_hand_values(loss_type):
    logp, rollout = hand_example()
    config = GRPOConfig(loss_type=loss_type, beta=0.1, epsilon=0.2, epsilon_high=0.28)
    loss, stats = PolicyLoss.from_config(config)(logp, rollout)
    assert loss.item() == pytest.approx(EXPECTED_LOSS[loss_type], abs=1e-6)
    assert stats["clip_frac_high"].item() == pytest.approx(1 / 3)  # r=1.5 with A>0
    assert stats["clip_frac_low"].item() == pytest.approx(1 / 3)  # r=0.5 with A<0
    assert stats["clip_frac_region"].item() == pytest.approx(2 / 3)
    assert stats["ratio_mean"].item() == pytest.approx((1.5 + 0.9 + 0.5) / 3)
    assert stats["kl"].item() == pytest.approx(KL, abs=1e-6)
    # approx_kl = mean((r - 1) - ln r) = (0.094535 + 0.005361 + 0.193147) / 3
    assert stats["approx_kl"].item() == pytest.approx(0.0976810, abs=1e-6)
    assert all(not v.requires_grad for v in stats.values())
    assert not any("loss" in key for key in stats)  # MMEngine's parse_losses would sum such keys
    # pg_term: the same aggregation without the KL term, e.g. grpo ((-1.28 - 0.9) / 2 + 0.8) / 2 = -0.145
    assert stats["pg_term"].item() == pytest.approx(EXPECTED_PG[loss_type], abs=1e-6)
    loss.backward()
    assert logp.grad[0, 1] != 0 and logp.grad[1, 1] == 0  # the masked element gets no gradient


def test_dapo_uses_the_global_token_count():
    # the 3 local active elements are part of a 7-element global batch: loss = active sum / 7
    logp, rollout = hand_example()
    loss, _ = PolicyLoss(epsilon=0.2, epsilon_high=0.28, beta=0.1, aggregate=LOSS_AGGREGATIONS["dapo"])(
        logp, rollout, num_active_tokens=7)
    assert loss.item() == pytest.approx(ACTIVE_SUM / 7, abs=1e-6)


def test_mask_truncated_completions_zeroes_truncated_rows():
    # row 1 truncated: bnpo = (-1.28 - 0.9 + 2 * 0.0306853) / 2 = -1.059315
    logp, rollout = hand_example(is_truncated=torch.tensor([False, True]))
    config = GRPOConfig(loss_type="bnpo", beta=0.1, epsilon=0.2, epsilon_high=0.28, mask_truncated_completions=True)
    loss, _ = PolicyLoss.from_config(config)(logp, rollout)
    assert loss.item() == pytest.approx((-1.28 - 0.9) / 2 + 0.1 * KL, abs=1e-6)


def test_without_old_logp_the_gradient_is_reinforce():
    # old_logp None (num_iterations == 1): ratio 1, bnpo with beta 0 -> dloss/dlogp_ij = -A_i / (active count)
    logp = torch.tensor([[-0.3, -2.0], [-1.0, -0.5]], requires_grad=True)
    rollout = make_rollout(torch.zeros(2, 2), advantages=torch.tensor([2.0, -1.0]))
    rollout.old_logp = None
    loss, stats = PolicyLoss(epsilon=0.2, epsilon_high=0.2, beta=0.0, aggregate=LOSS_AGGREGATIONS["bnpo"])(
        logp, rollout)
    loss.backward()
    assert loss.item() == pytest.approx(-(2.0 + 2.0 - 1.0 - 1.0) / 4)
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5, -0.5], [0.25, 0.25]]))
    assert stats["clip_frac_region"].item() == 0.0


def test_policy_loss_rejects_inconsistent_inputs():
    logp, rollout = hand_example()
    policy_loss = PolicyLoss(epsilon=0.2, epsilon_high=0.2, beta=0.1, aggregate=LOSS_AGGREGATIONS["grpo"])
    with pytest.raises(ValueError, match="action_mask"):
        policy_loss(logp[:, :1], rollout)
    with pytest.raises(ValueError, match="advantages is None"):
        policy_loss(logp, make_rollout(torch.zeros(2, 2), ref_logp=torch.zeros(2, 2)))
    with pytest.raises(ValueError, match="needs rollout.ref_logp"):
        policy_loss(logp, make_rollout(torch.zeros(2, 2), advantages=torch.zeros(2)))


def test_rollout_validates_shapes_and_dtypes():
    with pytest.raises(ValueError, match="B \\* G == N"):
        Rollout(group_size=2, old_logp=None, ref_logp=None, action_mask=torch.ones(3, 2, dtype=torch.bool),
                rewards=torch.zeros(1, 2), is_truncated=torch.zeros(3, dtype=torch.bool), max_action_length=2,
                replay=None)
    with pytest.raises(TypeError, match="torch.bool"):
        make_rollout(torch.zeros(2, 2), action_mask=torch.ones(2, 2))
    with pytest.raises(ValueError, match="ref_logp has shape"):
        make_rollout(torch.zeros(2, 2), ref_logp=torch.zeros(2, 3))
    rollout = make_rollout(torch.zeros(2, 2)).with_advantages(torch.tensor([0.5, -0.5]))
    assert rollout.advantages.tolist() == [0.5, -0.5] and rollout.num_prompts == 1 and rollout.num_rollouts == 2


# ---- GRPOConfig --------------------------------------------------------------------------------------------

def test_config_defaults_and_derived_epsilon_high():
    config = GRPOConfig()
    assert (config.num_generations, config.loss_type, config.scale_rewards, config.ema_decay) == (8, "dapo", "group",
                                                                                                   0.999)
    assert config.epsilon_high == config.epsilon == 0.2
    assert GRPOConfig(epsilon_high=0.28).epsilon_high == 0.28


@pytest.mark.parametrize("loss_type", sorted(LOSS_AGGREGATIONS))
def test_config_resolves_loss_type_once(loss_type):
    assert PolicyLoss.from_config(GRPOConfig(loss_type=loss_type)).aggregate is LOSS_AGGREGATIONS[loss_type]


@pytest.mark.parametrize("kwargs, knob", [
    ({"num_generations": 1}, "num_generations=1"),
    ({"num_generations": 4, "generation_chunk_size": 6}, "generation_chunk_size=6"),
    ({"loss_type": "ppo"}, "loss_type='ppo'"),
    ({"scale_rewards": True}, "scale_rewards=True"),
    ({"mask_policy": "threshold"}, "mask_policy='threshold'"),
    ({"ema_decay": 1.0}, "ema_decay=1.0"),
    ({"ema_decay": 0.0}, "ema_decay=0.0"),
    ({"epsilon": 0.0}, "epsilon=0.0"),
    ({"top_p": 0.0}, "top_p=0.0"),
    ({"temperature": 0.0}, "temperature=0.0"),
    ({"beta": -0.1}, "beta=-0.1"),
    ({"num_iterations": 0}, "num_iterations=0"),
    ({"mask_pool": 0}, "mask_pool=0"),
    ({"multimask_score": "softmax"}, "multimask_score='softmax'"),
    ({"reward_weights": {"judge": float("inf")}}, "reward_weights\\['judge'\\]"),
    ({"mask_to_caption_weight": 0.0, "caption_to_mask_weight": 0.0}, "at least one > 0"),
])
def test_config_rejects_bad_values_naming_the_knob(kwargs, knob):
    with pytest.raises(ValueError, match=knob):
        GRPOConfig(**kwargs)


def test_grpo_package_does_not_import_mmengine():
    # DESIGN §2: grpo/ is framework-free; checked in a fresh interpreter so other tests' imports do not mask it
    code = "import sys, projects.llava_sam2.rl_train.grpo; print(any(m.startswith('mmengine') for m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
