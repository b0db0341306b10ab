"""grpo/mask_policy.py: exact log-probs vs torch.distributions, sample/re-score consistency, gradient reach, the
region policy's masks, and a REINFORCE sanity check that GRPO steps raise a toy reward for every policy."""
from dataclasses import dataclass

import pytest
import torch
from torch import distributions as D
from torch import nn

from projects.llava_sam2.rl_train.grpo.advantages import group_advantages
from projects.llava_sam2.rl_train.grpo.config import GRPOConfig
from projects.llava_sam2.rl_train.grpo.losses import LOSS_AGGREGATIONS, PolicyLoss
from projects.llava_sam2.rl_train.grpo.mask_policy import (
    MASK_POLICIES, BernoulliMaskPolicy, GaussianSegPolicy, MaskHead, MultimaskPolicy, RegionMaskPolicy,
    build_mask_policy)
from projects.llava_sam2.rl_train.grpo.rollout import MaskReplay, Rollout
from projects.llava_sam2.rl_train.model.pipeline.region_chain import MaskChain, region_sample_points

N, E, H = 4, 256, 8  # rollouts, prompt width, low-res mask side


@dataclass
class Decoded:
    low_res_logits: torch.Tensor  # [N, 3, h, w]
    iou_scores: torch.Tensor  # [N, 3]
    best_logits: torch.Tensor  # [N, h, w]


class ToyDecoder(nn.Module):
    """A SAM2-decoder stand-in: prompt [N, 256] -> 3 candidate masks [N, 3, H, H] and IoU scores [N, 3]."""

    def __init__(self):
        super().__init__()
        self.masks = nn.Linear(E, 3 * H * H)
        self.iou_head = nn.Linear(E, 3)

    def forward(self, prompt):
        low_res = self.masks(prompt).view(-1, 3, H, H)  # [N, 3, H, H]
        iou = torch.sigmoid(self.iou_head(prompt))  # [N, 3]
        best = low_res[torch.arange(len(prompt)), iou.argmax(-1)]  # [N, H, H]
        return Decoded(low_res, iou, best)


# Region chain of the toy heads: 8x8 low-res logits, SAM2 input 32 px, images of 20x28 px (non-square, sides not
# multiples of g), region grid g = 4.
CHAIN = MaskChain(sizes=((20, 28),) * N, sam_image_size=32, grid_size=4)


def fixed_head(logits=None, iou=None, prompt=None):
    """A head whose decoder returns the given tensors (so tests can differentiate w.r.t. them)."""
    logits = torch.randn(N, 3, H, H) if logits is None else logits
    iou = torch.rand(N, 3) if iou is None else iou
    prompt = torch.randn(N, E) if prompt is None else prompt
    return MaskHead(prompt, lambda p: Decoded(logits, iou, logits[:, 0]), chain=CHAIN)


def chain_at_points_fp64(best_logits, chain):
    """Reference: the released chain in fp64 (bilinear h -> S -> (H, W)), read at the region sample points."""
    out = []
    for z, (h, w) in zip(best_logits.double(), chain.sizes):
        up = nn.functional.interpolate(z[None, None], size=(chain.sam_image_size,) * 2, mode="bilinear",
                                       align_corners=False)
        up = nn.functional.interpolate(up, size=(h, w), mode="bilinear", align_corners=False)[0, 0]
        out.append(up[region_sample_points(h, chain.grid_size)][:, region_sample_points(w, chain.grid_size)])
    return torch.stack(out)  # [N, g, g]


def test_registry_and_build_from_config():
    assert set(MASK_POLICIES) == {"region", "bernoulli", "gaussian_seg", "multimask"}
    assert isinstance(build_mask_policy(GRPOConfig()), RegionMaskPolicy)  # the default
    assert build_mask_policy(GRPOConfig(mask_policy="region", mask_temperature=0.5)).temperature == 0.5
    policy = build_mask_policy(GRPOConfig(mask_policy="bernoulli", mask_pool=2, mask_temperature=0.5))
    assert isinstance(policy, BernoulliMaskPolicy) and (policy.pool, policy.temperature) == (2, 0.5)
    assert isinstance(build_mask_policy(GRPOConfig(mask_policy="gaussian_seg", seg_noise_std=0.3)), GaussianSegPolicy)
    assert build_mask_policy(GRPOConfig(mask_policy="multimask")).temperature == 1.0


@pytest.mark.parametrize("pool", [1, 2])
def test_bernoulli_log_prob_matches_torch_distributions(pool):
    policy = BernoulliMaskPolicy(mask_temperature=0.7, mask_pool=pool)
    head = fixed_head()
    action, log_prob = policy.sample(head)
    assert action.shape == (N, H // pool, H // pool) and action.dtype == torch.bool
    assert log_prob.shape == (N, (H // pool) ** 2)
    cell_logits = nn.functional.avg_pool2d(head.decoded.best_logits[:, None], pool)[:, 0] / 0.7
    expected = D.Bernoulli(logits=cell_logits).log_prob(action.float()).flatten(1)
    torch.testing.assert_close(log_prob, expected)
    torch.testing.assert_close(policy.log_prob(head, action), log_prob)  # re-scoring = the sampling path


def test_region_log_prob_is_the_bernoulli_of_the_chain_at_the_sample_points():
    # each cell's logit = the fp64 released chain (8 -> 32 -> 20x28 bilinear) at that cell's sample point, / tau
    policy = RegionMaskPolicy(mask_temperature=0.7)
    head = fixed_head()
    action, log_prob = policy.sample(head, torch.Generator().manual_seed(0))
    assert action.shape == (N, 4, 4) and action.dtype == torch.bool and log_prob.shape == (N, 16)
    assert log_prob.dtype == torch.float32
    expected = D.Bernoulli(logits=chain_at_points_fp64(head.decoded.best_logits, CHAIN) / 0.7)
    torch.testing.assert_close(log_prob.double(), expected.log_prob(action.double()).flatten(1), rtol=0, atol=1e-5)
    torch.testing.assert_close(policy.log_prob(head, action), log_prob)  # re-scoring = the sampling path


@pytest.mark.parametrize("name", sorted(MASK_POLICIES))
def test_log_probs_stay_fp32_under_bf16_autocast(name):
    """The configs train under bf16 autocast; the action's log-probs must not round to bf16 there (region's chain
    matmuls did: ~1e-2 per cell). Same action, same decoder outputs: autocast changes nothing."""
    policy = build_mask_policy(GRPOConfig(mask_policy=name, mask_temperature=0.7))
    seeded = torch.Generator().manual_seed(1)
    logits, iou = torch.randn(N, 3, H, H, generator=seeded) * 4, torch.rand(N, 3, generator=seeded)
    prompt = torch.randn(N, E, generator=seeded)
    action, log_prob = policy.sample(fixed_head(logits, iou, prompt), torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a new head: its cached chain values are computed here
        under_autocast = policy.log_prob(fixed_head(logits, iou, prompt), action)
    assert under_autocast.dtype == torch.float32
    torch.testing.assert_close(under_autocast, log_prob, rtol=0, atol=1e-6)


def test_region_pred_masks_hold_exactly_the_sampled_cells():
    policy = RegionMaskPolicy()
    head = fixed_head()
    action, _ = policy.sample(head, torch.Generator().manual_seed(1))
    masks = policy.pred_masks(head, action)
    assert len(masks) == N and masks[0].shape == (20, 28) and masks[0].dtype == torch.bool
    for mask, cells in zip(masks, action):  # the processor's rule: nearest sampling at (floor(r H/g), floor(c W/g))
        sampled = nn.functional.interpolate(mask.float()[None, None], size=(4, 4), mode="nearest")[0, 0] > 0
        assert torch.equal(sampled, cells)
    with pytest.raises(NotImplementedError, match="pred_masks"):
        policy.decision_logits(head, action)
    with pytest.raises(ValueError, match="chain="):
        policy.sample(MaskHead(head.seg_prompt, head.decode))


def test_gaussian_log_prob_matches_torch_distributions():
    policy = GaussianSegPolicy(seg_noise_std=0.3)
    head = fixed_head()
    action, log_prob = policy.sample(head)
    assert action.shape == log_prob.shape == (N, E)
    torch.testing.assert_close(log_prob, D.Normal(head.seg_prompt, 0.3).log_prob(action))
    torch.testing.assert_close(policy.log_prob(head, action), log_prob)
    assert 0.2 < (action - head.seg_prompt).std().item() < 0.4  # the noise has the configured scale


@pytest.mark.parametrize("score", ["iou", "logit_iou"])
def test_multimask_log_prob_matches_torch_distributions(score):
    policy = MultimaskPolicy(mask_temperature=0.5, multimask_score=score)
    iou = torch.rand(N, 3) * 0.98 + 0.01
    head = fixed_head(iou=iou)
    action, log_prob = policy.sample(head)
    assert action.shape == (N,) and log_prob.shape == (N, 1)
    scores = iou if score == "iou" else torch.log(iou / (1 - iou))
    expected = D.Categorical(logits=scores / 0.5).log_prob(action)[:, None]
    torch.testing.assert_close(log_prob, expected)
    torch.testing.assert_close(policy.log_prob(head, action), log_prob)


def test_sampling_is_seeded_and_follows_the_probabilities():
    # Bernoulli cells with logit ln 3 (p = 0.75), sampled 4 x 8 x 8 x 50 times: mean within 0.02 of 0.75
    logits = torch.full((N, 3, H, H), torch.log(torch.tensor(3.0)).item())
    policy = BernoulliMaskPolicy(mask_pool=1)
    head = fixed_head(logits=logits)
    draws = torch.stack([policy.sample(head, torch.Generator().manual_seed(s))[0] for s in range(50)])
    assert abs(draws.float().mean().item() - 0.75) < 0.02
    again = policy.sample(head, torch.Generator().manual_seed(0))[0]
    assert torch.equal(again, draws[0])


def test_gradients_reach_logits_embedding_and_iou_inputs():
    logits = torch.randn(N, 3, H, H, requires_grad=True)
    iou = (torch.rand(N, 3) * 0.9 + 0.05).requires_grad_(True)
    prompt = torch.randn(N, E, requires_grad=True)
    for policy, leaf in [(BernoulliMaskPolicy(mask_pool=2), logits), (GaussianSegPolicy(0.1), prompt),
                         (MultimaskPolicy(), iou), (RegionMaskPolicy(), logits)]:
        logits.grad = iou.grad = prompt.grad = None
        head = fixed_head(logits=logits, iou=iou, prompt=prompt)
        _, log_prob = policy.sample(head)
        log_prob.sum().backward()
        assert leaf.grad is not None and leaf.grad.abs().sum() > 0, policy.name


def test_gradient_reach_through_a_decoder_matches_the_docstrings():
    decoder = ToyDecoder()
    prompt = torch.randn(N, E, requires_grad=True)

    def grads(policy):
        decoder.zero_grad(set_to_none=True)
        prompt.grad = None
        policy.sample(MaskHead(prompt, decoder, chain=CHAIN))[1].sum().backward()
        return {n: p.grad is not None and p.grad.abs().sum() > 0 for n, p in decoder.named_parameters()}, prompt.grad

    reach, prompt_grad = grads(BernoulliMaskPolicy(mask_pool=2))
    assert reach["masks.weight"] and not reach["iou_head.weight"] and prompt_grad.abs().sum() > 0
    reach, prompt_grad = grads(RegionMaskPolicy())
    assert reach["masks.weight"] and not reach["iou_head.weight"] and prompt_grad.abs().sum() > 0
    reach, prompt_grad = grads(GaussianSegPolicy(0.1))  # decoder is the environment: no gradient at all
    assert not any(reach.values()) and prompt_grad.abs().sum() > 0
    reach, prompt_grad = grads(MultimaskPolicy())
    assert reach["iou_head.weight"] and not reach["masks.weight"] and prompt_grad.abs().sum() > 0


def test_decoded_masks_are_what_the_partner_sees():
    decoder = ToyDecoder()
    head = MaskHead(torch.randn(N, E), decoder)
    bern = BernoulliMaskPolicy(mask_pool=2)
    cells, _ = bern.sample(head)
    upsampled = cells.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2)  # [N, H, H]
    assert torch.equal(bern.decoded_mask(head, cells), upsampled)

    gauss = GaussianSegPolicy(0.5)
    prompt_sample, _ = gauss.sample(head)
    assert torch.equal(gauss.decoded_mask(head, prompt_sample), decoder(prompt_sample).best_logits > 0)
    assert not torch.equal(gauss.decoded_mask(head, prompt_sample), head.decoded.best_logits > 0)

    multi = MultimaskPolicy()
    choice, _ = multi.sample(head)
    expected = head.decoded.low_res_logits[torch.arange(N), choice] > 0
    assert torch.equal(multi.decoded_mask(head, choice), expected)


def test_bernoulli_pool_must_divide_the_mask():
    with pytest.raises(ValueError, match="mask_pool=3"):
        BernoulliMaskPolicy(mask_pool=3).sample(fixed_head())


# ---- REINFORCE sanity: a few GRPO steps on a toy reward raise the policy's expected reward --------------

G, TARGET = 16, torch.tensor([[1, 0, 1, 0], [0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 1, 1]], dtype=torch.bool)
TARGET_PROMPT = torch.linspace(-1.0, 1.0, E)


def toy_problem(name):
    """(policy, parameter, head builder, reward of sampled actions [G], expected reward of the policy)."""
    if name == "region":  # the same 4x4 target through an identity chain (4 -> 4 -> 4x4 px, g = 4)
        z = torch.zeros(1, 4, 4, requires_grad=True)
        chain = MaskChain(sizes=((4, 4),) * G, sam_image_size=4, grid_size=4)
        head = lambda: MaskHead(torch.zeros(G, E), lambda p: Decoded(None, None, z.expand(G, 4, 4)), chain=chain)
        reward = lambda a: (a == TARGET).float().mean((1, 2))
        expected = lambda: (torch.sigmoid(z) * TARGET + (1 - torch.sigmoid(z)) * ~TARGET).mean()
        return RegionMaskPolicy(), z, head, reward, expected
    if name == "bernoulli":  # match a 4x4 target pattern; E[r] = mean(p t + (1 - p)(1 - t))
        z = torch.zeros(1, 4, 4, requires_grad=True)
        head = lambda: MaskHead(torch.zeros(G, E), lambda p: Decoded(None, None, z.expand(G, 4, 4)))
        reward = lambda a: (a == TARGET).float().mean((1, 2))
        expected = lambda: (torch.sigmoid(z) * TARGET + (1 - torch.sigmoid(z)) * ~TARGET).mean()
        return BernoulliMaskPolicy(mask_pool=1), z, head, reward, expected
    if name == "gaussian_seg":  # reach a target prompt; E[r] = -mean((e - t)^2) - sigma^2
        e = torch.zeros(1, E, requires_grad=True)
        head = lambda: MaskHead(e.expand(G, E), lambda p: None)
        reward = lambda a: -((a - TARGET_PROMPT) ** 2).mean(1)
        expected = lambda: -((e - TARGET_PROMPT) ** 2).mean() - 0.3**2
        return GaussianSegPolicy(seg_noise_std=0.3), e, head, reward, expected
    # multimask: choose output 2; E[r] = p(2)
    s = torch.zeros(1, 3, requires_grad=True)
    head = lambda: MaskHead(torch.zeros(G, E), lambda p: Decoded(None, torch.sigmoid(s).expand(G, 3), None))
    reward = lambda a: (a == 2).float()
    policy = MultimaskPolicy()
    expected = lambda: policy.choice_logits(head()).softmax(-1)[0, 2]
    return policy, s, head, reward, expected


@pytest.mark.parametrize("name", sorted(MASK_POLICIES))
def test_grpo_steps_raise_the_expected_toy_reward(name):
    policy, param, head, reward, expected = toy_problem(name)
    optimizer = torch.optim.SGD([param], lr={"region": 30.0, "bernoulli": 30.0, "gaussian_seg": 20.0,
                                             "multimask": 2.0}[name])
    loss_fn = PolicyLoss(epsilon=0.2, epsilon_high=0.2, beta=0.0, aggregate=LOSS_AGGREGATIONS["grpo"])
    generator = torch.Generator().manual_seed(0)
    start = expected().item()
    for _ in range(15):
        action, log_prob = policy.sample(head(), generator)
        advantages, _ = group_advantages(reward(action)[None], "group")
        rollout = Rollout(
            group_size=G, old_logp=None, ref_logp=None, action_mask=torch.ones_like(log_prob, dtype=torch.bool),
            rewards=reward(action)[None], is_truncated=torch.zeros(G, dtype=torch.bool),
            max_action_length=log_prob.shape[1], advantages=advantages,
            replay=MaskReplay(*(torch.zeros(G, 1, dtype=torch.long),) * 5, action=action), loop="caption_to_mask")
        loss, _ = loss_fn(log_prob, rollout)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    end = expected().item()
    assert end > start + 0.1 * abs(start) + 0.05, f"{name}: expected reward {start:.3f} -> {end:.3f}"
