"""grpo/cycle.py + passes.py on the tiny Sa2VA: each loop's gradient reach (per mask policy, as the policy docstrings
claim), GRPO steps that raise a deterministic reward of each loop, the partner's conventions and statistics, and the
grouped mask head. (The pipeline they run, model/pipeline/shared.py, is tested in test_model_pipeline.py.)"""
from __future__ import annotations

import pytest
import torch

from grpo_tiny import (
    CaptionParityReward, build_tiny, make_algo, one_thread, run_rollout, shapes_batch, step_loss, tokenizer)
from projects.llava_sam2.rl_train.grpo import cycle
from projects.llava_sam2.rl_train.grpo.cycle import seg_mask_head
from projects.llava_sam2.rl_train.grpo.mask_policy import MaskHead
from projects.llava_sam2.rl_train.grpo.passes import partner_describe, partner_segment
from projects.llava_sam2.rl_train.model.decoding import fast_generation
from projects.llava_sam2.rl_train.model.decoding.generation import Completions
from projects.llava_sam2.rl_train.model.decoding.text_decoding import TextDecoding

_one_thread = pytest.fixture(autouse=True)(one_thread)

DECODER = "grounding_encoder.sam2_model.sam_mask_decoder."
LOOP1_ONLY = dict(mask_to_caption_weight=1.0, caption_to_mask_weight=0.0)
LOOP2_ONLY = dict(mask_to_caption_weight=0.0, caption_to_mask_weight=1.0)


def group_of(name: str) -> str:
    """Coarse parameter group: lora | mlp1 | fcs | decoder.<submodule>."""
    if "lora_" in name:
        return "lora"
    if name.startswith("mlp1."):
        return "mlp1"
    if name.startswith("text_hidden_fcs."):
        return "fcs"
    if name.startswith(DECODER):
        return "decoder." + name[len(DECODER):].split(".")[0]
    raise AssertionError(f"unexpected trainable tensor {name}")


def grad_report(model) -> dict[str, float]:
    """name -> |grad| sum (0.0 for None) over the trainable tensors."""
    return {n: 0.0 if p.grad is None else float(p.grad.abs().sum()) for n, p in model.named_parameters()
            if p.requires_grad}


def assert_reach(report: dict[str, float], all_nonzero: set[str], some_nonzero: set[str], zero: set[str]) -> None:
    """Every tensor of an ``all_nonzero`` group has a gradient, at least one of a ``some_nonzero`` group does, and
    none of a ``zero`` group does; failures name the parameter."""
    by_group: dict[str, list[tuple[str, float]]] = {}
    for name, value in report.items():
        by_group.setdefault(group_of(name), []).append((name, value))
    for group in all_nonzero:
        for name, value in by_group[group]:
            assert value > 0, f"no gradient reached {name} (group {group})"
    for group in some_nonzero:
        assert any(v > 0 for _, v in by_group[group]), f"no tensor of group {group} got a gradient"
    for group in zero:
        for name, value in by_group[group]:
            assert value == 0, f"{name} (group {group}) got a gradient ({value:.3g}) the policy does not claim"


def loop_grads(model, processor, rewards, **config):
    algo, _ = make_algo(model, processor, rewards, **config)
    model.zero_grad(set_to_none=True)
    step = run_rollout(algo, shapes_batch(2))
    rollouts = step.rollouts
    assert len(rollouts) == 1
    assert rollouts[0].advantages.abs().sum() > 0, "the test reward gave every group zero spread; no signal"
    out = step_loss(algo, model, step)
    assert torch.isfinite(out["loss"])
    return grad_report(model)


@pytest.mark.parametrize("preset", ["tiny", "tiny_qwen3"])
def test_loop1_gradients_reach_lora_and_mlp1_only(preset):
    model, processor = build_tiny(preset=preset)
    report = loop_grads(model, processor, {"mask_to_caption": [CaptionParityReward()]}, **LOOP1_ONLY)
    decoder_groups = {g for g in map(group_of, report) if g.startswith("decoder.")}
    assert_reach(report, all_nonzero={"lora", "mlp1"}, some_nonzero=set(), zero={"fcs", *decoder_groups})


# Reach claimed by each mask policy's docstring (grpo/mask_policy.py), as (every tensor, some tensor, no tensor).
POLICY_REACH = {
    "region": ({"lora", "mlp1", "fcs", "decoder.output_upscaling", "decoder.conv_s0", "decoder.conv_s1"},
               {"decoder.transformer", "decoder.output_hypernetworks_mlps"},
               {"decoder.iou_prediction_head", "decoder.pred_obj_score_head"}),
    "bernoulli": ({"lora", "mlp1", "fcs", "decoder.output_upscaling", "decoder.conv_s0", "decoder.conv_s1"},
                  {"decoder.transformer", "decoder.output_hypernetworks_mlps"},
                  {"decoder.iou_prediction_head", "decoder.pred_obj_score_head"}),
    "gaussian_seg": ({"lora", "mlp1", "fcs"}, set(),
                     {"decoder.transformer", "decoder.output_upscaling", "decoder.output_hypernetworks_mlps",
                      "decoder.iou_prediction_head", "decoder.conv_s0", "decoder.conv_s1", "decoder.mask_tokens"}),
    "multimask": ({"lora", "mlp1", "fcs", "decoder.iou_prediction_head"}, {"decoder.transformer"},
                  {"decoder.output_upscaling", "decoder.output_hypernetworks_mlps", "decoder.conv_s0",
                   "decoder.conv_s1"}),
}


@pytest.mark.parametrize("policy, preset", [(policy, "tiny") for policy in sorted(POLICY_REACH)] +
                         [("region", "tiny_qwen3")])
def test_loop2_gradients_reach_what_the_mask_policy_claims(policy, preset):
    model, processor = build_tiny(preset=preset)
    report = loop_grads(model, processor, {"caption_to_mask": [dict(type="iou")]}, use_partner_captions=False,
                        mask_policy=policy, seg_noise_std=1.0, **LOOP2_ONLY)
    all_nonzero, some_nonzero, zero = POLICY_REACH[policy]
    assert_reach(report, all_nonzero, some_nonzero, zero)
    hyper = {n: v for n, v in report.items() if "output_hypernetworks_mlps.0." in n}
    assert all(v == 0 for v in hyper.values()), "the single-mask output (index 0) is never decoded in multimask mode"


def mean_reward(algo, batch, repeats: int = 2) -> float:
    """Mean reward of the current policy on a fixed batch, over ``repeats`` rollouts (B * G each)."""
    rewards = []
    for _ in range(repeats):
        scored = algo.score(algo.rollout(algo.encode(batch)))
        rewards.append(scored.rollouts[0].rewards.mean())
    return float(torch.stack(rewards).mean())


def train_steps(algo, model, batch, steps: int, lr: float) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=lr)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        step = run_rollout(algo, batch)
        step_loss(algo, model, step)
        optimizer.step()


class TokenSetReward:
    """Loop-1 test reward on the sampled tokens: the fraction of caption tokens in ``token_set``. The caption text is
    rendered as the token ids themselves (see ``ids_as_text``), so the reward is exactly a function of the action."""

    name, weight = "token_set", 1.0

    def __init__(self, token_set: set[int]):
        self.token_set = token_set

    def __call__(self, inputs):
        values = []
        for caption in inputs.pred_captions:
            ids = [int(t) for t in caption.split()]
            values.append(sum(t in self.token_set for t in ids) / len(ids) if ids else 0.0)
        return values


class PixelAccuracyReward:
    """Loop-2 test reward: fraction of pixels where the sampled mask equals gt_mask."""

    name, weight = "pixel_accuracy", 1.0

    def __call__(self, inputs):
        return [float((m == g).float().mean()) for m, g in zip(inputs.pred_masks, inputs.gt_masks)]


def ids_as_text(completions, decoding):
    return [" ".join(str(t) for t, a in zip(ids, row) if a)
            for ids, row in zip(completions.ids.tolist(), completions.completion_mask.tolist())]


@pytest.mark.parametrize("loop", ["mask_to_caption", "caption_to_mask"])
def test_grpo_steps_raise_the_expected_reward(loop, monkeypatch):
    """The estimator points the right way: a few Adam steps on one fixed batch raise the policy's mean reward.

    Loop 1: fraction of caption tokens in a fixed half of the vocabulary (the tokens whose LM-head row points along a
    random direction). The random tiny LM head is scaled x10 first: at init its logits span +-0.2, and LoRA cannot
    move a distribution through a frozen head that flat (RMSNorm fixes |h|). Loop 2: pixel accuracy of the sampled
    Bernoulli mask against gt_mask. (IoU is the natural mask reward, but on random weights it only improves by
    placing the mask, a slow 256-cell credit assignment that needs tens of steps; pixel accuracy also rewards
    shrinking the 50%-area initial masks towards the small shapes.)
    """
    model, processor = build_tiny(seed=1)
    if loop == "mask_to_caption":
        head = model.language_model.get_output_embeddings().weight
        with torch.no_grad():
            head.mul_(10.0)
        direction = torch.randn(head.shape[1], generator=torch.Generator().manual_seed(0))
        token_set = set((head.detach() @ direction > 0).nonzero().squeeze(-1).tolist())
        monkeypatch.setattr(cycle, "completion_texts", ids_as_text)
        rewards, config = {"mask_to_caption": [TokenSetReward(token_set)]}, dict(LOOP1_ONLY, max_completion_length=4)
    else:
        rewards = {"caption_to_mask": [PixelAccuracyReward()]}
        config = dict(LOOP2_ONLY, use_partner_captions=False)
    algo, _ = make_algo(model, processor, rewards, num_generations=8, seed=0, **config)
    batch = shapes_batch(2, seed=3)
    before = mean_reward(algo, batch)
    train_steps(algo, model, batch, steps=3, lr=1e-2)
    after = mean_reward(algo, batch)
    assert after > before + 0.1, f"{loop}: mean reward {before:.3f} -> {after:.3f} after 3 GRPO steps"


# ---- partner and helpers --------------------------------------------------------------------------------------


def scripted(rows: list[list[int]]):
    """A decoder stand-in that returns the given token rows (right padded), in order over the calls."""
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    completion_mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
        completion_mask[i, :len(row)] = True

    start = [0]  # next scripted row (calls may come in chunks)

    def sample(lm, embeds, attention, **kwargs):
        assert kwargs["do_sample"] is False  # the partner answers greedily
        r0, r1 = start[0], start[0] + len(embeds)
        start[0] = r1 % len(rows)
        return Completions(ids[r0:r1], completion_mask[r0:r1], torch.zeros(r1 - r0, dtype=torch.bool),
                           torch.zeros(r1 - r0, T))

    return sample


def test_partner_segment_conventions_and_stats(monkeypatch):
    """Empty captions are not asked; an answer with a fed-back [SEG] gives its first mask; an answer without one, or
    with [SEG] as its last token, gives an all-False mask; the counts say so."""
    model, processor = build_tiny()
    model.eval()
    tok, seg, eos = tokenizer(), model.seg_token_id, tokenizer().eos_token_id
    rows = [tok.encode("Sure,", add_special_tokens=False) + [seg, 13, seg, eos],  # first of two fed-back [SEG]
            tok.encode("It is", add_special_tokens=False) + [eos],  # no [SEG]: all-False mask
            tok.encode("Sure,", add_special_tokens=False) + [seg]]  # [SEG] as last token: dropped (upstream)
    monkeypatch.setitem(fast_generation.DECODE_BACKENDS, "fast", scripted(rows))
    algo, _ = make_algo(model, processor, {"caption_to_mask": [dict(type="iou")]})
    features = algo.encode(shapes_batch(3, seed=5))
    captions = ["a red circle", "", "the blue square", "green thing"]
    with torch.no_grad():
        masks, stats = partner_segment(model, processor, features, model.project_vision(features.vit_tokens),
                                       captions, [0, 1, 1, 2], TextDecoding.from_processor(processor),
                                       max_new_tokens=4, chunk_size=2)
    assert [bool(m.any()) for m in masks] == [True, False, False, False] and masks[1].shape == (64, 64)
    assert stats == {"partner/empty_caption": 1.0, "partner/no_seg": 2.0,
                     "partner/answer_tokens": (len(rows[0]) + len(rows[1]) + len(rows[2])) / 3}


def test_partner_describe_conventions_and_stats(monkeypatch):
    """An all-False mask gets the caption "" without a model call; a mask that hits no region-grid point is shown as
    the one cell it covers most; captions are the answers' plain text."""
    model, processor = build_tiny()
    model.eval()
    tok = tokenizer()
    rows = [tok.encode("a red", add_special_tokens=False) + [model.seg_token_id, tok.eos_token_id],
            tok.encode("dot <image>", add_special_tokens=False) + [tok.eos_token_id]]
    monkeypatch.setitem(fast_generation.DECODE_BACKENDS, "fast", scripted(rows))
    algo, _ = make_algo(model, processor, {"caption_to_mask": [dict(type="iou")]})
    features = algo.encode(shapes_batch(2, seed=5))
    tiny_dot = torch.zeros(64, 64, dtype=torch.bool)
    tiny_dot[1, 1] = True  # between the region grid's sample points
    pred_masks = [torch.ones(64, 64, dtype=torch.bool), torch.zeros(64, 64, dtype=torch.bool), tiny_dot]
    with torch.no_grad():
        captions, stats = partner_describe(model, processor, features, model.project_vision(features.vit_tokens),
                                           pred_masks, [0, 1, 1], ["a", "b", "c"],
                                           TextDecoding.from_processor(processor), max_new_tokens=4, chunk_size=None)
    assert captions == ["a red", "", "dot"]
    assert stats == {"partner/empty_mask": 1.0, "partner/caption_tokens": (len(rows[0]) + len(rows[1])) / 2}


def test_grouped_mask_head_equals_decoding_every_row():
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, {"caption_to_mask": [dict(type="iou")]}, use_partner_captions=False,
                        **LOOP2_ONLY)
    step = run_rollout(algo, shapes_batch(2))
    features, rollouts = step.features, step.rollouts
    replay, G = rollouts[0].replay, rollouts[0].group_size
    with torch.no_grad():
        tiles = model.project_vision(features.vit_tokens)
        head = seg_mask_head(model, features, tiles, replay, range(2), G)
        plain = MaskHead(head.seg_prompt, head.decode)
        assert torch.equal(head.seg_prompt[:G], head.seg_prompt[:1].expand(G, -1))  # one [SEG] per group
        torch.testing.assert_close(head.decoded.best_logits, plain.decoded.best_logits)
        torch.testing.assert_close(head.decoded.iou_scores, plain.decoded.iou_scores)
        # the rollout's decoded masks come from the sampled action
        logp = algo.context.mask_policy.log_prob(head, replay.action)
    assert logp.shape == rollouts[0].action_mask.shape
