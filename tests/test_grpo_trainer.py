"""grpo/trainer.py CycleGRPO on the tiny Sa2VA: frozen encoders once per image, minibatches and the old_logp rule,
the weighted two-loop loss, switched-off loops, bit-exact partner/reference swaps (also when something raises), and
the build-time errors."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from grpo_tiny import TINY_CONFIG, build_tiny, make_algo, one_thread, run_rollout, shapes_batch, step_loss
from projects.llava_sam2.rl_train.grpo import cycle
from projects.llava_sam2.rl_train.grpo.rollout import CaptionReplay, MaskReplay

_one_thread = pytest.fixture(autouse=True)(one_thread)


class CaptionWordsReward:
    """Loop-2 test reward: words in the partner's caption (records what it was given)."""

    name, weight = "words", 1.0

    def __init__(self):
        self.seen = []

    def __call__(self, inputs):
        self.seen.append(inputs)
        return [float(len(c.split())) for c in inputs.pred_captions]


class RaisingReward:
    name, weight = "boom", 1.0

    def __call__(self, inputs):
        raise RuntimeError("reward failed on purpose")


def both_loops_rewards():
    return {"mask_to_caption": [dict(type="iou")], "caption_to_mask": [CaptionWordsReward()]}


def trainable_snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def assert_bit_identical(model, snapshot):
    for name, param in model.named_parameters():
        if param.requires_grad:
            assert torch.equal(param, snapshot[name]), f"policy tensor {name} changed"


def test_frozen_encoders_run_once_per_image_per_step(monkeypatch):
    model, processor = build_tiny()
    rewards = both_loops_rewards()
    algo, _ = make_algo(model, processor, rewards, beta=0.04)
    calls = {"vision": [], "grounding": []}
    encode_vision, encode_grounding = model.encode_vision, model.encode_grounding
    monkeypatch.setattr(model, "encode_vision", lambda x: calls["vision"].append(len(x)) or encode_vision(x))
    monkeypatch.setattr(model, "encode_grounding", lambda x: calls["grounding"].append(len(x)) or encode_grounding(x))
    batch = shapes_batch(3)
    batch[2] = dataclasses.replace(batch[2], image=batch[0].image)  # a second region of the first image
    step = run_rollout(algo, batch)
    features, rollouts = step.features, step.rollouts
    out = step_loss(algo, model, step)
    assert calls == {"vision": [2], "grounding": [2]}, "each distinct image must be encoded once per step"
    assert features.image_index.tolist() == [0, 1, 0]
    assert [type(r.replay) for r in rollouts] == [CaptionReplay, MaskReplay]
    assert all(r.ref_logp is not None for r in rollouts)  # beta > 0: the reference pass ran, without re-encoding
    assert torch.isfinite(out["loss"])
    inputs = rewards["caption_to_mask"][0].seen[0]
    assert len(inputs.pred_captions) == 12 and all(isinstance(c, str) for c in inputs.pred_captions)
    assert inputs.gt_captions[4] == batch[1].captions and len(inputs.pred_masks) == 12
    assert rollouts[1].reward_stats["partner/empty_mask"] >= 0 and "partner/no_seg" in rollouts[0].reward_stats


def test_minibatches_chunk_groups_and_old_logp_makes_ratio_one():
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, both_loops_rewards(), minibatch_size=4, num_iterations=2,
                        generation_chunk_size=4)  # sampling and no-grad scoring one group per call
    step = run_rollout(algo, shapes_batch(2))
    rollouts = step.rollouts
    assert all(r.old_logp is not None for r in rollouts)  # several optimizer steps per rollout batch
    minibatches = list(algo.minibatches(step))
    assert [mb.iteration for mb in minibatches] == [0, 0, 1, 1]
    assert [list(part.samples) for part in minibatches[1].parts] == [[1], [1]]
    for part in minibatches[0].parts:
        assert part.rollout.num_rollouts == 4 and part.rollout.rewards.shape == (1, 4)
        assert part.num_active_tokens == pytest.approx(float(rollouts[0 if part.loop.name == "mask_to_caption" else 1]
                                                             .action_mask.sum()) / 2)
    # data parallel: dapo's normaliser is the global count / world size / chunks (cross_rank_sum comes from the
    # engine); here a second rank with 10 active elements per loop
    algo.cross_rank_sum = lambda values: values + torch.tensor([10.0, 1.0])
    for part in next(algo.minibatches(step)).parts:
        local = float(rollouts[0 if part.loop.name == "mask_to_caption" else 1].action_mask.sum())
        assert part.num_active_tokens == pytest.approx((local + 10.0) / 2 / 2)
    algo.cross_rank_sum = lambda values: values
    with torch.no_grad():
        stats = algo.policy_loss(model, minibatches[0])
    for loop in ("mask_to_caption", "caption_to_mask"):  # the loss re-scores the action as the sampling pass did
        assert stats[f"{loop}/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        assert stats[f"{loop}/approx_kl"] == pytest.approx(0.0, abs=1e-6)


def test_dropout_is_off_and_checkpointed_loss_gives_the_same_gradients():
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, both_loops_rewards())
    assert algo.num_dropouts_disabled > 0  # LoRA's dropout 0.05 modules
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    step = run_rollout(algo, shapes_batch(2))
    grads = []
    for use_checkpointing in (False, True):
        if use_checkpointing:  # as in training: train mode, checkpointed LLM layers recomputed in backward
            model.language_model.gradient_checkpointing_enable()
            model.language_model.enable_input_require_grads()
            assert model.language_model.get_decoder().gradient_checkpointing
        model.train()
        model.zero_grad(set_to_none=True)
        step_loss(algo, model, step)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any("lora_" in n for n in grads[0])
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-7, msg=name)


def test_loss_is_the_weighted_sum_of_the_loop_losses():
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, both_loops_rewards(), beta=0.04, caption_to_mask_weight=0.5,
                        loss_type="dapo")
    step = run_rollout(algo, shapes_batch(2))
    rollouts = step.rollouts
    assert all(r.old_logp is None for r in rollouts)  # one minibatch, one iteration: ratio is logp - logp.detach()
    (minibatch,) = list(algo.minibatches(step))
    out = algo.policy_loss(model, minibatch)
    assert [k for k in out if "loss" in k] == ["loss"] and out["loss"].requires_grad
    # dapo over one minibatch: L = pg_term + beta * mean_k3, per loop; total = 1.0 * L1 + 0.5 * L2
    per_loop = {loop: out[f"{loop}/pg_term"] + 0.04 * out[f"{loop}/kl"]
                for loop in ("mask_to_caption", "caption_to_mask")}
    torch.testing.assert_close(out["loss"].detach(), per_loop["mask_to_caption"] + 0.5 * per_loop["caption_to_mask"])
    assert out["mask_to_caption/kl"] > 0  # the perturbed LoRA differs from the adapter-off reference


def test_a_loop_with_weight_zero_is_not_run(monkeypatch):
    model, processor = build_tiny()

    def never(*args, **kwargs):
        raise AssertionError("loop 1's partner pass ran although mask_to_caption_weight=0")

    monkeypatch.setattr(cycle, "partner_segment", never)
    algo, _ = make_algo(model, processor, {"caption_to_mask": [dict(type="iou")]}, mask_to_caption_weight=0.0,
                        use_partner_captions=False)
    step = run_rollout(algo, shapes_batch(2))
    features, rollouts = step.features, step.rollouts
    assert [type(r.replay) for r in rollouts] == [MaskReplay] and features.region_cells is None
    out = step_loss(algo, model, step)
    assert not any(k.startswith("mask_to_caption/") for k in out)
    algo, _ = make_algo(model, processor, {"mask_to_caption": [dict(type="iou")]}, caption_to_mask_weight=0.0)
    batch = [dataclasses.replace(s, captions=[], expressions=[]) for s in shapes_batch(2)]  # no text needed
    features = algo.encode(batch)
    assert features.prompt_texts is None and features.region_cells.shape == (2, 8, 8)


def test_partner_and_reference_swaps_leave_the_policy_bit_identical(monkeypatch):
    model, processor = build_tiny()
    algo, weights = make_algo(model, processor, {"mask_to_caption": [dict(type="iou")],
                                                 "caption_to_mask": [RaisingReward()]}, beta=0.04)
    with torch.no_grad():  # policy != partner != reference, so a missed restore would show
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.01 * torch.randn_like(param))
    snapshot = trainable_snapshot(model)
    with weights.partner(model):
        assert any(not torch.equal(p, snapshot[n]) for n, p in model.named_parameters() if p.requires_grad)
    batch = shapes_batch(2)
    sampled = algo.rollout(algo.encode(batch))
    assert_bit_identical(model, snapshot)
    with pytest.raises(RuntimeError, match="on purpose"):
        algo.score(sampled)  # loop 2's reward raises
    assert_bit_identical(model, snapshot)

    calls = []
    project_vision = model.project_vision

    def fail_in_second_pass(x):  # loop 1: 1st projection = sampling policy, 2nd = inside the reference swap
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("reference pass failed")
        return project_vision(x)

    monkeypatch.setattr(model, "project_vision", fail_in_second_pass)
    with pytest.raises(RuntimeError, match="reference pass failed"):
        algo.rollout(algo.encode(batch))
    monkeypatch.setattr(model, "project_vision", project_vision)
    monkeypatch.setattr(processor, "caption_prompt", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("partner")))
    algo2, _ = make_algo(model, processor, {"caption_to_mask": [dict(type="iou")]}, mask_to_caption_weight=0.0)
    with pytest.raises(RuntimeError, match="partner"):  # loop 2 calls caption_prompt only inside the partner swap
        algo2.rollout(algo2.encode(batch))
    assert_bit_identical(model, snapshot)
    with weights.reference(model):  # no swap was left active
        pass


def test_negative_reward_weights_override_and_penalise():
    # reward_weights may be negative (TRL semantics); they override the rewards' weights and enter the total
    from projects.llava_sam2.rl_train.grpo.config import GRPOConfig
    from projects.llava_sam2.rl_train.grpo.trainer import build_composer
    from projects.llava_sam2.rl_train.rewards import RewardInputs, build_reward

    class Const:
        def __init__(self, name, value):
            self.name, self.weight, self.value = name, 1.0, value

        def __call__(self, inputs):
            return [self.value] * len(inputs)

    config = GRPOConfig(**{**TINY_CONFIG, "reward_weights": {"quality": 1.0, "length": -0.25}})
    composer = build_composer([Const("quality", 0.8), Const("length", 2.0)], config, "mask_to_caption")
    assert [r.weight for r in composer.rewards] == [1.0, -0.25]
    total, _ = composer.compute(RewardInputs(sample_ids=["a", "b"]))
    assert total.tolist() == pytest.approx([0.8 - 0.25 * 2.0] * 2)  # 0.3
    assert build_reward(dict(type="iou", weight=-1.0)).weight == -1.0  # a reward's own weight too
    config = GRPOConfig(**{**TINY_CONFIG, "reward_weights": {"quality": 0.0, "length": 0.0}})
    with pytest.raises(ValueError, match="weight 0 after reward_weights"):
        build_composer([Const("quality", 0.8), Const("length", 2.0)], config, "mask_to_caption")


def test_build_and_call_errors_name_the_knob():
    model, processor = build_tiny()
    with pytest.raises(ValueError, match="minibatch_size=6 is not a positive multiple of num_generations=4"):
        make_algo(model, processor, minibatch_size=6)
    with pytest.raises(ValueError, match="exactly one"):
        make_algo(model, processor, seg_answer="Sure.", mask_to_caption_weight=1.0,
                  rewards={"caption_to_mask": [dict(type="iou")]})
    with pytest.raises(ValueError, match="'mask_to_caption' and/or"):
        make_algo(model, processor, {"loop3": []})
    with pytest.raises(ValueError, match=r"reward_weights names \['ioo'\]"):
        make_algo(model, processor, {"caption_to_mask": [dict(type="iou")]}, reward_weights={"ioo": 1.0})
    with pytest.raises(ValueError, match="weight 0 after reward_weights"):
        make_algo(model, processor, {"caption_to_mask": [dict(type="iou")]}, reward_weights={"iou": 0.0})
    algo, _ = make_algo(model, processor, {"caption_to_mask": [dict(type="iou", name="mask_iou")]},
                        reward_weights={"iou": 0.5, "mask_iou": 2.0})
    assert [r.weight for r in algo.loops[0].composer.rewards] == [0.5]
    assert [r.weight for r in algo.loops[1].composer.rewards] == [2.0]
    with pytest.raises(ValueError, match="empty batch"):
        algo.encode([])
    batch = [dataclasses.replace(s, captions=[], expressions=[]) for s in shapes_batch(2)]
    with pytest.raises(ValueError, match=f"no sample of the step has a caption.*{batch[0].sample_id}.*"
                                         "caption_to_mask_weight=0"):  # a text-less sample is region-only data
        algo.rollout(algo.encode(batch))


def nan_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def test_stages_return_new_values_and_leave_their_inputs_unchanged():
    """Each stage hands the next a new value that carries the step's features; no stage changes its input, and
    nothing is parked on the algorithm between stages: a step sampled before another step can still be scored (twice,
    with the same result) and trained on its own features."""
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, both_loops_rewards())  # IoU and word-count rewards: deterministic
    first = algo.rollout(algo.encode(shapes_batch(2, seed=1)))
    second = algo.rollout(algo.encode(shapes_batch(3, seed=2)))  # a later step, of another size
    scored = algo.score(first)
    assert all(torch.isnan(r.rewards).all() and r.reward_stats == {} for r in first.rollouts)  # input unchanged
    assert scored.features is first.features and [r.loop for r in scored.rollouts] == [r.loop for r in first.rollouts]
    for rollout, again, inputs in zip(scored.rollouts, algo.score(first).rollouts, first.reward_inputs):
        expected, _ = algo._loop_of(rollout).composer.compute(inputs)  # [N]: the rewards of first's own predictions
        assert nan_equal(rollout.rewards.reshape(-1), expected.float()) and not torch.isnan(rollout.rewards).all()
        assert nan_equal(again.rewards, rollout.rewards)  # scoring twice gives the same values
    advantaged = algo.compute_advantages(scored)
    assert all(r.advantages is None for r in scored.rollouts)  # input unchanged
    assert all(r.advantages.shape == (8,) for r in advantaged.rollouts)
    (minibatch,) = list(algo.minibatches(advantaged))
    assert minibatch.features is first.features  # not the features of the step encoded last
    assert [part.rollout.num_prompts for part in minibatch.parts] == [2, 2]
    assert torch.isfinite(algo.policy_loss(model, minibatch)["loss"])
    assert second.rollouts[0].num_prompts == 3 and torch.isnan(second.rollouts[0].rewards).all()
    with pytest.raises(dataclasses.FrozenInstanceError):
        scored.rollouts[0].rewards = torch.zeros(2, 4)  # a Rollout is frozen: stages return copies


def test_fast_and_reference_decoding_give_the_same_rollouts():
    """decode_backend='fast' (B prompts prefilled once, G samples each, one group per call here) draws the same
    captions as the reference loop on N repeated rows with the same seed, so the partner passes, the mask draws
    (same generator state afterwards) and the rewards agree too."""
    model, processor = build_tiny()
    batch = shapes_batch(2)
    results = {}
    for backend in ("fast", "reference"):
        rewards = both_loops_rewards()
        algo, _ = make_algo(model, processor, rewards, beta=0.04, generation_chunk_size=4, decode_backend=backend)
        assert algo.context.decoding.decode_backend == backend
        step = run_rollout(algo, batch)
        rollouts = step.rollouts
        results[backend] = rollouts, rewards["caption_to_mask"][0].seen[0].pred_captions
    (fast, fast_captions), (ref, ref_captions) = results["fast"], results["reference"]
    assert torch.equal(fast[0].replay.completion_ids, ref[0].replay.completion_ids)
    assert torch.equal(fast[0].action_mask, ref[0].action_mask) and fast[0].action_mask.sum() > 8
    assert len(set(map(tuple, fast[0].replay.completion_ids.tolist()))) > 1  # the G samples differ
    assert torch.equal(fast[1].replay.action, ref[1].replay.action)
    assert fast_captions == ref_captions and any(fast_captions)
    for f, r in zip(fast, ref):
        torch.testing.assert_close(f.rewards, r.rewards)
        torch.testing.assert_close(f.ref_logp, r.ref_logp)
    with pytest.raises(ValueError, match="decode_backend='vllm'"):
        make_algo(model, processor, decode_backend="vllm")
