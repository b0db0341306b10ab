"""grpo/dense.py and the dense mask options of the cycle loops (GRPOConfig ``*_dense_*``, ``mask_policy=
'deterministic'``) on the tiny Sa2VA: what each loss reaches, that weight 0 is the old loss bit for bit, the
positive-advantage gating, and the deterministic loop 2 (no mask-cell log-prob; the target is the group's best)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from grpo_tiny import CaptionParityReward, build_tiny, make_algo, one_thread, run_rollout, shapes_batch, step_loss
from projects.llava_sam2.rl_train.grpo import GRPOConfig, cycle, mask_policy
from projects.llava_sam2.rl_train.grpo.dense import best_in_group, dense_rollout_weights
from projects.llava_sam2.rl_train.grpo.rollout import AnswerReplay
from projects.llava_sam2.rl_train.model.sft.sft_loss import mask_loss_per_mask, mask_losses

_one_thread = pytest.fixture(autouse=True)(one_thread)

LOOP1 = dict(mask_to_caption_weight=1.0, caption_to_mask_weight=0.0)
LOOP2_DET = dict(mask_to_caption_weight=0.0, caption_to_mask_weight=1.0, mask_policy="deterministic")
FEW_POINTS = dict(dense_num_points=256)
DECODER = "grounding_encoder.sam2_model.sam_mask_decoder."


def grads(model) -> dict[str, float]:
    return {n: 0.0 if p.grad is None else float(p.grad.abs().sum()) for n, p in model.named_parameters()
            if p.requires_grad}


def group_total(report: dict[str, float], prefix: str) -> float:
    return sum(v for n, v in report.items() if prefix in n)


# ---- the pure pieces -----------------------------------------------------------------------------------------


def test_rollout_weights_gate_on_positive_advantage():
    A = torch.tensor([0.5, -1.0, 0.0, 2.0, -0.3, -0.2, -0.1, -0.4])  # two groups of G = 4
    assert dense_rollout_weights(A, 4, "positive").tolist() == [1, 0, 0, 1, 0, 0, 0, 0]
    assert dense_rollout_weights(A, 4, "advantage").tolist() == [0.5, 0, 0, 2.0, 0, 0, 0, 0]
    assert dense_rollout_weights(A, 4, "best").tolist() == [0, 0, 0, 1, 0, 0, 0, 0]  # group 2 has no A > 0
    with pytest.raises(ValueError, match="rule='all' is not one of"):
        dense_rollout_weights(A, 4, "all")


def test_best_in_group_skips_nan_and_flat_groups():
    rewards = torch.tensor([[0.1, float("nan"), 0.7, 0.2], [0.3, 0.3, 0.3, 0.3], [float("nan")] * 4])
    best, has_spread = best_in_group(rewards)
    assert best[0] == 2 and has_spread.tolist() == [True, False, False]


def test_per_mask_loss_is_upstreams_mask_loss_per_mask():
    torch.manual_seed(0)
    logits, gt = torch.randn(3, 16, 16), torch.zeros(3, 16, 16)
    gt[0, 2:9, 3:12], gt[1, 8:, :5], gt[2, 4:12, 4:12] = 1, 1, 1
    kw = dict(num_points=64)
    per_mask = mask_loss_per_mask(logits, gt, generator=torch.Generator().manual_seed(1), **kw)
    loss_mask, loss_dice = mask_losses(logits, gt, generator=torch.Generator().manual_seed(1), **kw)
    # same points, same weights: the mean over masks is upstream's loss_mask + loss_dice (avg factors 1e-4 aside)
    torch.testing.assert_close(per_mask.mean(), loss_mask + loss_dice, rtol=1e-4, atol=0)
    good = mask_loss_per_mask(gt * 8 - 4, gt, generator=torch.Generator().manual_seed(1), **kw)
    assert (good < per_mask).all()


def test_config_names_the_dense_knobs():
    with pytest.raises(ValueError, match="caption_to_mask_dense_weight=0.5 needs mask_policy='deterministic'"):
        GRPOConfig(caption_to_mask_dense_weight=0.5)
    with pytest.raises(ValueError, match="mask_to_caption_dense_rollouts='all'"):
        GRPOConfig(mask_to_caption_dense_rollouts="all")
    with pytest.raises(ValueError, match="mask_to_caption_dense_weight=-1"):
        GRPOConfig(mask_to_caption_dense_weight=-1.0)
    assert GRPOConfig(mask_policy="deterministic", caption_to_mask_dense_weight=1.0).mask_policy == "deterministic"


# ---- loop 1: the policy segments its own caption ---------------------------------------------------------------


def loop1_loss(model, processor, **config):
    algo, _ = make_algo(model, processor, {"mask_to_caption": [CaptionParityReward()]}, seed=3, **LOOP1, **config)
    torch.manual_seed(5)
    step = run_rollout(algo, shapes_batch(2))
    model.zero_grad(set_to_none=True)
    out = step_loss(algo, model, step)
    return algo, step, out


def test_loop1_weight_zero_is_the_policy_gradient_loss_bit_for_bit():
    model, processor = build_tiny()
    algo, step, out = loop1_loss(model, processor, mask_to_caption_dense_weight=0.0)
    (rollout,) = step.rollouts
    assert rollout.replay.seg_prompt_ids is None  # no RES prompts tokenized when off
    assert not any("dense" in k for k in out)
    # the pre-change loss: the loop's PolicyLoss on its caption log-probs, nothing else
    (minibatch,) = list(algo.minibatches(step))
    (part,) = minibatch.parts
    tiles = model.project_vision(minibatch.features.vit_tokens)
    logp = part.loop.action_logp(model, minibatch.features, tiles, part.rollout, part.samples)
    old, _ = part.loop.loss_fn(logp, part.rollout, num_active_tokens=part.num_active_tokens)
    assert torch.equal(out["loss"].detach(), old.detach())
    report = grads(model)
    assert group_total(report, DECODER) == 0 and group_total(report, "text_hidden_fcs") == 0


def test_loop1_dense_loss_reaches_decoder_fcs_and_lora_and_adds_to_the_loss():
    model, processor = build_tiny()
    algo, step, out = loop1_loss(model, processor, mask_to_caption_dense_weight=0.5, **FEW_POINTS)
    (rollout,) = step.rollouts
    assert (rollout.advantages > 0).any()
    torch.testing.assert_close(out["loss"].detach(),
                               out["mask_to_caption/pg_term"] + 0.5 * out["mask_to_caption/dense_term"])
    assert out["mask_to_caption/dense_term"] > 0
    expected_frac = float(((rollout.advantages > 0) & rollout.replay.has_caption).float().mean())
    assert float(out["mask_to_caption/dense_frac"]) == pytest.approx(expected_frac)
    report = grads(model)
    assert group_total(report, DECODER + "output_upscaling") > 0
    assert all(v > 0 for n, v in report.items() if n.startswith("text_hidden_fcs."))
    lora_b = [v for n, v in report.items() if "lora_B" in n]
    assert all(v > 0 for v in lora_b), "the [SEG] hidden state carries the dense loss into every LoRA layer"


def test_loop1_dense_loss_runs_only_on_positive_advantage_rollouts(monkeypatch):
    model, processor = build_tiny()
    segmented = []
    original = cycle.teacher_forced_seg_logits

    def spy(model, features, tile_embeds, prompt_ids, *args, **kwargs):
        segmented.append(prompt_ids.shape[0])
        return original(model, features, tile_embeds, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(cycle, "teacher_forced_seg_logits", spy)
    _, step, out = loop1_loss(model, processor, mask_to_caption_dense_weight=1.0, **FEW_POINTS)
    (rollout,) = step.rollouts
    positive = int(((rollout.advantages > 0) & rollout.replay.has_caption).sum())
    assert 0 < positive < rollout.num_rollouts and segmented == [positive]
    # the same rollouts with every advantage <= 0: no segmentation pass, a zero dense term, still a valid loss
    segmented.clear()
    algo = make_algo(model, processor, {"mask_to_caption": [CaptionParityReward()]}, **LOOP1,
                     mask_to_caption_dense_weight=1.0, **FEW_POINTS)[0]
    flat = rollout.with_advantages(-rollout.advantages.abs())
    features = algo.encode(shapes_batch(2))
    tiles = model.project_vision(features.vit_tokens)
    loss, stats = algo.loops[0].dense_loss(model, features, tiles, flat, range(2))
    assert segmented == [] and float(loss.detach()) == 0 and loss.requires_grad


# ---- loop 2: deterministic mask from the sampled answer's [SEG] ------------------------------------------------


class AreaReward:
    """Loop-2 test reward: the area of the predicted mask (deterministic, differs across masks)."""

    name, weight = "area", 1.0

    def __call__(self, inputs):
        return [float(m.float().mean()) for m in inputs.pred_masks]


def with_seg_in_even_rows(sample_text, seg_token_id: int):
    """``sample_text`` whose even rows answer '<sampled token> [SEG] <sampled token> ...': a random tiny model
    never samples [SEG] by itself, and the sampled first token makes the G masks of a group differ."""

    def sample(model, embeds, attention, decoding, **kwargs):
        out = sample_text(model, embeds, attention, decoding, **kwargs)
        ids, mask = out.ids, out.completion_mask
        if ids.shape[1] < 3:
            pad = 3 - ids.shape[1]
            ids = torch.cat([ids, ids.new_full((len(ids), pad), decoding.pad_token_id)], 1)
            mask = torch.cat([mask, mask.new_zeros(len(mask), pad)], 1)
        ids, mask = ids.clone(), mask.clone()
        stop = set(decoding.stop_token_ids)
        for row in range(0, len(ids), 2):
            ids[row, 1] = seg_token_id
            for t in (0, 2):
                if int(ids[row, t]) in stop or not mask[row, t]:
                    ids[row, t] = 5 + row  # an ordinary token of the tiny vocabulary
            mask[row, :3] = True
        return dataclasses.replace(out, ids=ids, completion_mask=mask, token_logp=torch.zeros(ids.shape),
                                   is_truncated=out.is_truncated)

    return sample


def test_deterministic_loop2_scores_answer_tokens_only_and_pulls_toward_the_best(monkeypatch):
    def no_mask_cells(*args, **kwargs):
        raise AssertionError("a mask-cell log-prob was computed under mask_policy='deterministic'")

    for policy in mask_policy.MASK_POLICIES.values():
        monkeypatch.setattr(policy, "get_action_and_log_prob", no_mask_cells)
    model, processor = build_tiny()
    monkeypatch.setattr(cycle, "sample_text", with_seg_in_even_rows(cycle.sample_text, model.seg_token_id))
    algo, _ = make_algo(model, processor, {"caption_to_mask": [AreaReward()]}, use_partner_captions=False,
                        caption_to_mask_dense_weight=1.0, max_completion_length=8, temperature=2.0, seed=1,
                        **LOOP2_DET, **FEW_POINTS)
    assert isinstance(algo.loops[0], cycle.AnswerToMaskLoop) and algo.context.mask_policy is None
    step = run_rollout(algo, shapes_batch(2))
    (rollout,) = step.rollouts
    replay = rollout.replay
    assert isinstance(replay, AnswerReplay)
    # the action is the answer's tokens: log-probs per token, as many as the sampled answers have
    assert rollout.action_mask.shape == replay.completion_ids.shape
    has_seg = replay.seg_position >= 0
    assert has_seg.any(), "no sampled answer fed back a [SEG]; the test needs masks"
    assert not replay.seg_mask[~has_seg].any()
    # the self-training target of every pulled row is the stored mask of its group's best-scored member
    rows = torch.nonzero(has_seg).flatten()
    pulled, targets = algo.loops[0].self_training_targets(rows, rollout)
    G = rollout.group_size
    for row, is_pulled, target in zip(rows.tolist(), pulled.tolist(), targets):
        group = rollout.rewards[row // G]
        assert is_pulled == bool(group.max() > group.min())
        assert torch.equal(target, replay.seg_mask[row // G * G + int(group.argmax())])
    assert pulled.any(), "every group's masks scored equal; the test needs a best member"
    model.zero_grad(set_to_none=True)
    out = step_loss(algo, model, step)
    torch.testing.assert_close(out["loss"].detach(),
                               out["caption_to_mask/pg_term"] + out["caption_to_mask/dense_term"])
    assert out["caption_to_mask/dense_term"] > 0
    assert float(out["caption_to_mask/dense_frac"]) == pytest.approx(float(pulled.sum()) / rollout.num_rollouts)
    report = grads(model)
    assert group_total(report, DECODER + "output_upscaling") > 0
    assert all(v > 0 for n, v in report.items() if n.startswith("text_hidden_fcs."))
    assert group_total(report, "lora_") > 0


def test_both_dense_options_encode_each_image_once_and_replay_the_sampling_pass(monkeypatch):
    """Loop 1's segmentation pass and loop 2's answer pass reuse the step's cached encoder features; with stored
    ``old_logp`` (two minibatches, two iterations) the first ratio of the answer tokens is exactly 1."""
    model, processor = build_tiny()
    monkeypatch.setattr(cycle, "sample_text", with_seg_in_even_rows(cycle.sample_text, model.seg_token_id))
    rewards = {"mask_to_caption": [CaptionParityReward()], "caption_to_mask": [AreaReward()]}
    algo, _ = make_algo(model, processor, rewards, use_partner_captions=False, mask_policy="deterministic", mask_to_caption_dense_weight=1.0,
                        caption_to_mask_dense_weight=1.0, beta=0.04, num_iterations=2, minibatch_size=4,
                        max_completion_length=8, temperature=2.0, seed=1, **FEW_POINTS)
    calls = {"vision": 0, "grounding": 0}
    encode_vision, encode_grounding = model.encode_vision, model.encode_grounding
    monkeypatch.setattr(model, "encode_vision", lambda x: calls.__setitem__("vision", calls["vision"] + 1)
                        or encode_vision(x))
    monkeypatch.setattr(model, "encode_grounding", lambda x: calls.__setitem__("grounding", calls["grounding"] + 1)
                        or encode_grounding(x))
    step = run_rollout(algo, shapes_batch(2))
    rollouts = step.rollouts
    assert all(r.old_logp is not None and r.ref_logp is not None for r in rollouts)
    first = next(iter(algo.minibatches(step)))
    out = algo.policy_loss(model, first)
    for loop in ("mask_to_caption", "caption_to_mask"):
        assert float(out[f"{loop}/ratio_mean"]) == 1.0 and f"{loop}/dense_term" in out
    for minibatch in algo.minibatches(step):
        algo.policy_loss(model, minibatch)["loss"].backward()
    assert calls == {"vision": 1, "grounding": 1}, "the dense passes must not re-encode the images"
