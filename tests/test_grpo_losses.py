"""grpo/losses.py (+ config.py, rollout.py validation): clipped objective, k3 KL, the importance-sampling levels and
the four normalisations against hand-computed values on 2-4 element tensors."""
import dataclasses
import math
import subprocess
import sys

import pytest
import torch

from projects.llava_sam2.rl_train.grpo.config import GRPOConfig
from projects.llava_sam2.rl_train.grpo.losses import (
    IMPORTANCE_SAMPLING_LEVELS, LOSS_AGGREGATIONS, SEQUENCE_LENGTH_NORMS, PolicyLoss, clipped_objective, kl_k3)
from projects.llava_sam2.rl_train.grpo.rollout import CaptionReplay, Rollout

LN2 = math.log(2.0)


def make_rollout(old_logp, ref_logp=None, advantages=None, action_mask=None, is_truncated=None,
                 max_action_length=4, loop="mask_to_caption"):
    N, T = old_logp.shape
    ids = torch.zeros(N, T, dtype=torch.long)
    replay = CaptionReplay(prompt_ids=ids, prompt_attention=ids.bool(), completion_ids=ids,
                           image_index=torch.zeros(N, dtype=torch.long))
    return Rollout(
        group_size=2, old_logp=old_logp, ref_logp=ref_logp,
        action_mask=torch.ones(N, T, dtype=torch.bool) if action_mask is None else action_mask,
        rewards=torch.zeros(N // 2, 2), is_truncated=torch.zeros(N, dtype=torch.bool) if is_truncated is None
        else is_truncated, max_action_length=max_action_length, replay=replay, loop=loop, advantages=advantages)


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
    pg_loss, ratio, clipped = clipped_objective(logp - old_logp, torch.tensor([1.0, -1.0]),
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
    rollout = dataclasses.replace(make_rollout(torch.zeros(2, 2), advantages=torch.tensor([2.0, -1.0])), old_logp=None)
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
                replay=None, loop="mask_to_caption")
    with pytest.raises(ValueError, match="loop=''; give the producing loop's name"):
        make_rollout(torch.zeros(2, 2), loop="")
    with pytest.raises(TypeError, match="torch.bool"):
        make_rollout(torch.zeros(2, 2), action_mask=torch.ones(2, 2))
    with pytest.raises(ValueError, match="ref_logp has shape"):
        make_rollout(torch.zeros(2, 2), ref_logp=torch.zeros(2, 3))
    rollout = make_rollout(torch.zeros(2, 2)).with_advantages(torch.tensor([0.5, -0.5]))
    assert rollout.advantages.tolist() == [0.5, -0.5] and rollout.num_prompts == 1 and rollout.num_rollouts == 2


# ---- importance-sampling levels (TRL's importance_sampling_level; GSPO) --------------------------------------
# Hand example: N=2, T=3, epsilon 0.2 / 0.28, beta 0, advantages [+1, -1], loss_type grpo.
#   log-ratios row 0: [0.4, -0.2, 0.1] (all active)        -> mean 0.1  -> s_0 = e^0.1 = 1.105171 (inside the clip)
#   log-ratios row 1: [-0.6, -0.4, (5.0 masked)]           -> mean -0.5 -> s_1 = e^-0.5 = 0.606531 < 0.8, A < 0:
#                                                              clipped low, min(-0.606531, -0.8) = -0.8
#   pg: row 0 -1.105171, row 1 +0.8; grpo = mean of the row means of the broadcast terms = (-1.105171 + 0.8) / 2
#   gradient: row 0 d/dlogp_t (-s_0 A) / 2 rows = -s_0 / 3 / 2 = -0.184195 per active element; row 1: 0 (clipped)
S0, S1 = math.exp(0.1), math.exp(-0.5)


def sequence_example():
    old_logp = torch.full((2, 3), -1.0)
    logp = (old_logp + torch.tensor([[0.4, -0.2, 0.1], [-0.6, -0.4, 5.0]])).requires_grad_(True)
    rollout = make_rollout(old_logp, advantages=torch.tensor([1.0, -1.0]),
                           action_mask=torch.tensor([[True, True, True], [True, True, False]]))
    return logp, rollout


def test_sequence_level_is_trl_gspo_hand_values():
    logp, rollout = sequence_example()
    config = GRPOConfig(loss_type="grpo", beta=0.0, epsilon=0.2, epsilon_high=0.28, importance_sampling_level="sequence")
    loss, stats = PolicyLoss.from_config(config)(logp, rollout)
    assert loss.item() == pytest.approx((-S0 + 0.8) / 2, abs=1e-6)
    # per-rollout stats (TRL's masked_batch_mean of [N, 1]): row 1 is clipped low, row 0 is not clipped
    assert (stats["clip_frac_low"].item(), stats["clip_frac_high"].item()) == (0.5, 0.0)
    assert stats["clip_frac_region"].item() == 0.5
    assert stats["ratio_mean"].item() == pytest.approx((S0 + S1) / 2, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-S0 / 6] * 3, [0.0, 0.0, 0.0]]))


def test_sequence_level_dapo_weights_the_broadcast_term_by_length():
    # dapo: (3 * -s_0 + 2 * 0.8) / 5 active elements = -0.343103 (TRL broadcasts the sequence term over its tokens)
    logp, rollout = sequence_example()
    config = GRPOConfig(loss_type="dapo", beta=0.0, epsilon=0.2, epsilon_high=0.28, importance_sampling_level="sequence")
    loss, _ = PolicyLoss.from_config(config)(logp, rollout)
    assert loss.item() == pytest.approx((3 * -S0 + 2 * 0.8) / 5, abs=1e-6)


@pytest.mark.parametrize("norm, nu", [("mean", 2.0), ("sqrt", math.sqrt(2.0)), ("sum", 1.0)])
def test_sequence_length_norm_hand_values(norm, nu):
    # one rollout, T=2, log-ratios [0.4, -0.2] (sum 0.2), A=+1, beta 0.1, ref = logp + ln 2 (kl = 1 - ln 2 each):
    #   log_w = 0.2 / nu; s = exp(0.2 / nu) stays inside [0.8, 1.28] for every nu (e^0.2 = 1.2214)
    #   loss (grpo, one row) = -s + 0.1 * (T / nu) * mean_t kl = -s + 0.1 * 2 / nu * (1 - ln 2)
    #   d loss / d logp_t = -s / nu  (policy term; the KL's own gradient is added below)
    old_logp = torch.full((2, 2), -1.0)
    logp = (old_logp + torch.tensor([[0.4, -0.2], [0.0, 0.0]])).requires_grad_(True)
    rollout = make_rollout(old_logp, ref_logp=(logp + LN2).detach(), advantages=torch.tensor([1.0, 0.0]))
    config = GRPOConfig(loss_type="grpo", beta=0.1, epsilon=0.2, epsilon_high=0.28)
    loss_fn = PolicyLoss.from_config(config, "sequence", norm)
    loss, _ = loss_fn(logp, rollout)
    s = math.exp(0.2 / nu)
    row1 = 0.1 * 2 / nu * KL  # A = 0: only the KL term
    assert loss.item() == pytest.approx((-s + 0.1 * 2 / nu * KL + row1) / 2, abs=1e-6)
    loss.backward()
    # k3 gradient: d/dlogp [exp(ln 2) - ln 2 - 1] w.r.t. logp = -(exp(ref - logp) - 1) = -1 per element
    kl_grad = 0.1 * (2 / nu) / 2 * -1.0  # beta * scale * (1 / T from the row mean) * dk3
    expected = torch.tensor([[-s / nu, -s / nu], [0.0, 0.0]]) / 2 + kl_grad / 2
    torch.testing.assert_close(logp.grad, expected)


def test_a_small_logit_shift_on_many_cells_clips_the_mask_only_at_sequence_level():
    # 256 Bernoulli cells at p = 0.5, each logit moved 0.05 towards its sampled value:
    #   per-cell log-ratio = log sigmoid(0.05) - log 0.5 = 0.0246875 -> cell ratio 1.0250, inside [0.8, 1.2]
    #   whole-mask log-ratio = 256 * 0.0246875 = 6.3200 (ratio ~556)
    #   token: no element clipped; sequence/mean: s = e^0.0246875 = 1.0250, not clipped (GSPO needs epsilon ~1e-3)
    #   sequence/sqrt: s = e^(6.3200 / 16) = 1.4844 > 1.2 -> clipped; sequence/sum: s = e^6.3200 -> clipped
    T = 256
    sampled = torch.rand(1, T, generator=torch.Generator().manual_seed(0)) < 0.5
    shift = 0.05 * (sampled.float() * 2 - 1)  # towards the sampled value
    z_old, z_new = torch.zeros(2, T), shift.expand(2, T)
    m = sampled.expand(2, T).float()
    cell_logp = lambda z: m * torch.nn.functional.logsigmoid(z) + (1 - m) * torch.nn.functional.logsigmoid(-z)
    logp, old_logp = cell_logp(z_new), cell_logp(z_old)
    assert torch.allclose(logp - old_logp, torch.full((2, T), 0.0246875), atol=1e-6)
    rollout = make_rollout(old_logp, advantages=torch.tensor([1.0, -1.0]), max_action_length=T)
    config = GRPOConfig(loss_type="grpo", beta=0.0, epsilon=0.2)
    expected_clip = {("token", "mean"): 0.0, ("sequence", "mean"): 0.0, ("sequence", "sqrt"): 0.5,
                     ("sequence", "sum"): 0.5}  # the A = +1 mask is clipped high; the A = -1 one is not clipped
    for (level, norm), clip in expected_clip.items():
        _, stats = PolicyLoss.from_config(config, level, norm)(logp, rollout)
        assert stats["clip_frac_region"].item() == clip, (level, norm)
        assert stats["clip_frac_high"].item() == clip, (level, norm)


def test_every_level_and_norm_is_resolved_once_and_bad_names_are_rejected():
    for level in IMPORTANCE_SAMPLING_LEVELS:
        for norm in SEQUENCE_LENGTH_NORMS:
            loss_fn = PolicyLoss.from_config(GRPOConfig(), level, norm)
            assert loss_fn.log_weights.func is IMPORTANCE_SAMPLING_LEVELS[level]
            assert loss_fn.log_weights.keywords["length_norm"] is SEQUENCE_LENGTH_NORMS[norm]
    with pytest.raises(ValueError, match="importance_sampling_level='tokens'"):
        PolicyLoss.from_config(GRPOConfig(), "tokens")
    with pytest.raises(ValueError, match="length_norm='median'"):
        PolicyLoss.from_config(GRPOConfig(), "sequence", "median")


# ---- GRPOConfig --------------------------------------------------------------------------------------------

def test_config_defaults_and_derived_epsilon_high():
    config = GRPOConfig()
    assert (config.num_generations, config.loss_type, config.scale_rewards, config.ema_decay) == (8, "dapo", "group",
                                                                                                   0.999)
    assert config.epsilon_high == config.epsilon == 0.2
    assert GRPOConfig(epsilon_high=0.28).epsilon_high == 0.28
    assert (config.mask_policy, config.importance_sampling_level, config.mask_importance_sampling_level,
            config.mask_length_norm) == ("region", "token", "sequence", "sqrt")
    # loop 2's level: None gives TRL's meaning of the global one (derived once, like epsilon_high): its level and,
    # at sequence level, GSPO's mean length norm, not the sqrt loop 2 uses at its own level
    trl = GRPOConfig(importance_sampling_level="sequence", mask_importance_sampling_level=None)
    assert (trl.mask_importance_sampling_level, trl.mask_length_norm) == ("sequence", "mean")
    assert GRPOConfig(mask_importance_sampling_level=None, mask_length_norm="sum").mask_length_norm == "sum"  # explicit


def test_loop_2_at_none_scores_like_loop_1():
    """mask_importance_sampling_level=None: loop 2's PolicyLoss equals loop 1's, the TRL loss of
    importance_sampling_level (it kept mask_length_norm='sqrt' before: a different ratio at sequence level)."""
    config = GRPOConfig(importance_sampling_level="sequence", mask_importance_sampling_level=None, beta=0.0)
    loop_1 = PolicyLoss.from_config(config)
    loop_2 = PolicyLoss.from_config(config, config.mask_importance_sampling_level, config.mask_length_norm)
    logp = torch.tensor([[-0.5, -1.0, -0.2, -0.9], [-0.3, -0.4, -2.0, -0.1]], requires_grad=True)  # [N=2, T=4]
    rollout = make_rollout(logp.detach() - 0.05, advantages=torch.tensor([1.0, -1.0]), loop="caption_to_mask")
    # log-ratio 0.05 per element, T = 4: mean norm (TRL/GSPO) -> ratio exp(0.05); sqrt -> exp(0.2 / 2) = exp(0.1)
    loss_1, stats_1 = loop_1(logp, rollout)
    loss_2, stats_2 = loop_2(logp, rollout)
    torch.testing.assert_close(loss_2, loss_1)
    torch.testing.assert_close(stats_2["ratio_mean"], torch.tensor(math.exp(0.05)))


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
    ({"importance_sampling_level": "seq"}, "importance_sampling_level='seq'"),
    ({"importance_sampling_level": None}, "importance_sampling_level=None"),
    ({"mask_importance_sampling_level": "mask"}, "mask_importance_sampling_level='mask'"),
    ({"mask_length_norm": "log"}, "mask_length_norm='log'"),
    ({"reward_weights": {"judge": float("inf")}}, "reward_weights\\['judge'\\]"),
    ({"mask_to_caption_weight": 0.0, "caption_to_mask_weight": 0.0}, "at least one > 0"),
])
def test_config_rejects_bad_values_naming_the_knob(kwargs, knob):
    with pytest.raises(ValueError, match=knob):
        GRPOConfig(**kwargs)


def test_grpo_package_does_not_import_mmengine():
    # grpo/ is framework-free (docs/architecture.md); a fresh interpreter, so other tests' imports hide nothing
    code = "import sys, projects.llava_sam2.rl_train.grpo; print(any(m.startswith('mmengine') for m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
