"""Both loops scored in one pass over one image prefix per sample (``GRPOConfig.joint_loop_scoring``,
``cycle.joint_action_logps``): the same values and gradients as each loop's own pass, the first ratio exactly 1 over
several minibatches, and the separate passes wherever the loops cannot share their prompts."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from grpo_tiny import RecordedLogp, build_tiny, make_algo, one_thread, run_rollout, shapes_batch, step_loss
from projects.llava_sam2.rl_train.grpo.cycle import caption_prefix_lengths
from projects.llava_sam2.rl_train.grpo.rollout import AdvantagedStep

_one_thread = pytest.fixture(autouse=True)(one_thread)

REWARDS = {"mask_to_caption": [dict(type="iou")], "caption_to_mask": [dict(type="meteor")]}


def test_caption_prefix_is_the_common_start_of_the_real_tokens():
    pad = 0
    region = torch.tensor([[pad, 5, 6, 7, 8, 9], [5, 6, 1, 2, 3, 4]])  # left padded [B, L1]
    grounding = torch.tensor([[5, 6, 7, 3], [pad, pad, 5, 7]])  # [B, L2]
    lengths = caption_prefix_lengths(region, region != pad, grounding, grounding != pad)
    assert lengths.tolist() == [[3, 1], [1, 1]]  # (common start P, RES tokens after it S)
    same = caption_prefix_lengths(region[:1], region[:1] != pad, region[:1], region[:1] != pad)
    assert same.tolist() == [[5, 0]]  # the whole prompt in common: only the answer is left to the branch


def _step(beta: float = 0.0, **overrides):
    model, processor = build_tiny()
    model.float()  # fp32: the joint and separate passes then differ only by float order, far below 1e-5
    model.language_model.gradient_checkpointing_enable()
    model.train()
    algo, weights = make_algo(model, processor, REWARDS, beta=beta, **overrides)
    return model, algo, run_rollout(algo, shapes_batch(3))


def _separate(step: AdvantagedStep) -> AdvantagedStep:
    """The same step with loop 2 scored alone (no caption_prefix)."""
    rollouts = tuple(replace(r, replay=replace(r.replay, caption_prefix=None)) if r.loop == "caption_to_mask" else r
                     for r in step.rollouts)
    return replace(step, rollouts=rollouts)


def _with_advantages(step: AdvantagedStep, seed: int = 0) -> AdvantagedStep:
    gen = torch.Generator().manual_seed(seed)
    return replace(step, rollouts=tuple(r.with_advantages(torch.randn(r.num_rollouts, generator=gen))
                                        for r in step.rollouts))


def _grads(model, algo, step) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = step_loss(algo, model, step)["loss"]
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_joint_pass_equals_each_loops_own_pass_in_values_and_gradients():
    model, algo, step = _step()
    captions, masks = step.rollouts
    common = masks.replay.caption_prefix
    assert common is not None and captions.replay.prompt_ids.shape[0] == common.shape[0]
    image_tokens = step.features.n_tiles(0) * model.num_image_token
    assert bool((common[:, 0] > image_tokens).all())  # the image block is in the shared start
    features, samples = step.features, range(3)
    with torch.no_grad():
        tiles = model.project_vision(features.vit_tokens)
        joint = algo._joint_logps(model, features, tiles, captions, masks, samples)
        for loop, rollout in zip(algo.loops, step.rollouts):
            alone = loop.action_logp(model, features, tiles, rollout, samples)
            torch.testing.assert_close(joint[loop.name], alone, rtol=0, atol=1e-5)
    step = _with_advantages(step)  # non-zero advantages: every loop term has a gradient
    loss, grads = _grads(model, algo, step)
    separate_loss, separate_grads = _grads(model, algo, _separate(step))
    assert loss == pytest.approx(separate_loss, abs=1e-6)
    assert grads.keys() == separate_grads.keys() and any("lora" in n for n in grads)
    for name, grad in grads.items():
        assert bool(grad.abs().sum() > 0) or not bool(separate_grads[name].abs().sum() > 0), name
        torch.testing.assert_close(grad, separate_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_joint_reference_equals_each_loops_own_reference_pass():
    model, algo, step = _step(beta=0.04)
    _, separate_algo, separate_step = _step(beta=0.04, joint_loop_scoring=False)
    assert separate_step.rollouts[1].replay.caption_prefix is None
    for joint, alone in zip(step.rollouts, separate_step.rollouts):
        assert joint.ref_logp is not None and joint.ref_logp.shape == alone.ref_logp.shape
        torch.testing.assert_close(joint.ref_logp, alone.ref_logp, rtol=0, atol=1e-5)


def test_old_logp_of_a_joint_step_is_the_loss_pass_bit_for_bit_over_minibatches():
    """Three minibatches make the rollout keep old_logp; the joint loss pass must see the first ratio exactly 1, so
    old_logp is scored by the joint pass too (the loops' own passes round differently)."""
    model, algo, step = _step(minibatch_size=4)
    for loop in algo.loops:
        loop.loss_fn = RecordedLogp(loop.loss_fn)
    step_loss(algo, model, step)
    for loop in algo.loops:
        assert len(loop.loss_fn.seen) == 3  # three minibatches of one group
        for logp, old_logp in loop.loss_fn.seen:
            assert old_logp is not None and torch.equal(old_logp, logp), loop.name


@pytest.mark.parametrize("overrides", [dict(joint_loop_scoring=False), dict(mask_policy="deterministic"),
                                       dict(mask_to_caption_weight=0.0)])
def test_the_loops_are_scored_apart_where_they_cannot_share(overrides):
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, REWARDS, **overrides)
    step = run_rollout(algo, shapes_batch(2))
    masks = next(r for r in step.rollouts if r.loop == "caption_to_mask")
    assert getattr(masks.replay, "caption_prefix", None) is None
    out = step_loss(algo, model, step)
    assert torch.isfinite(out["loss"])


def test_bench_switches_joint_scoring_by_flag_and_sweep_key():
    from projects.llava_sam2.rl_train.benchmarks import rl_step as bench

    assert bench.parse_args([]).joint_loop_scoring
    assert not bench.parse_args(["--no-joint-loop-scoring"]).joint_loop_scoring
    assert bench.sweep_point("joint=off,keep=8") == {"joint_loop_scoring": False, "uncheckpointed_layers": 8}
    with pytest.raises(ValueError, match="joint=maybe"):
        bench.sweep_point("joint=maybe")
