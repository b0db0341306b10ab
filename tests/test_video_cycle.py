"""The two cycle loops on video steps (grpo/cycle.py, grpo/features.py, model/pipeline/video.py) on the tiny Sa2VA:
rollout shapes and exact log-probs, one optimizer step per loop with its gradient reach, the ``video_jf`` reward
against the J&F functions, the batch rules (no image/video mix, unpaired rows per loop), and the one-frame clip
that is the image loops' step."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from grpo_tiny import CaptionParityReward, build_tiny, make_algo, one_thread, run_rollout, shapes_batch, step_loss
from projects.llava_sam2.rl_train.data.shapes_video import ShapesVideoWorld
from projects.llava_sam2.rl_train.data.types import RegionSample
from projects.llava_sam2.rl_train.data.video import key_frame
from projects.llava_sam2.rl_train.evaluation.video_metrics import j_and_f, region_similarity
from projects.llava_sam2.rl_train.rewards import RewardInputs, build_reward
from projects.llava_sam2.rl_train.rewards.mask_metrics import IoUReward

_one_thread = pytest.fixture(autouse=True)(one_thread)

BOTH = dict(mask_to_caption_weight=1.0, caption_to_mask_weight=1.0, video_mllm_frames=2)
DECODER = "grounding_encoder.sam2_model.sam_mask_decoder."


class MaskAreaReward:
    """Loop-2 test reward that tells the G sampled masks apart: the mask's area fraction."""

    name, weight = "area", 1.0

    def __call__(self, inputs):
        return [float(torch.as_tensor(m).float().mean()) for m in inputs.pred_masks]


def clips(n: int = 2, num_frames: int = 3, seed: int = 0):
    world = ShapesVideoWorld("train", num_samples=n, seed=seed, image_size=64, num_frames=num_frames)
    return [world[i] for i in range(n)]


def rewards():
    return {"mask_to_caption": [CaptionParityReward()], "caption_to_mask": [MaskAreaReward()]}


@pytest.fixture(scope="module")
def video_step():
    """One rollout of both loops on two 3-frame clips (2 MLLM frames), old_logp kept (num_iterations=2)."""
    torch.set_num_threads(1)
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, rewards(), num_iterations=2, **BOTH)
    batch = clips()
    return model, processor, algo, batch, run_rollout(algo, batch)


def test_video_rollouts_have_the_loop_shapes_and_finite_rewards(video_step):
    model, _, algo, batch, step = video_step
    features = step.features
    assert features.video is not None and features.image_sizes == [(64, 64)] * 2
    assert [features.n_tiles(c) for c in range(2)] == [2, 2]  # the MLLM frames of each clip
    loop1, loop2 = step.rollouts
    G = algo.config.num_generations
    assert (loop1.loop, loop2.loop) == ("mask_to_caption", "caption_to_mask")
    for rollout in step.rollouts:
        assert rollout.rewards.shape == (2, G) and torch.isfinite(rollout.rewards).all()
        assert rollout.old_logp is not None and rollout.old_logp.shape == rollout.action_mask.shape
    # loop 2 decodes its action on a key frame: an MLLM frame of the sample's clip (frame rows of the clips' SAM2)
    rows = loop2.replay.grounding_index.view(2, G)
    assert (rows == rows[:, :1]).all()
    assert all(features.video.encoded.frame_start[b] <= int(rows[b, 0]) < features.video.encoded.frame_start[b] + 2
               for b in range(2))
    assert "video/policy_jf" in loop2.reward_stats and 0 <= loop2.reward_stats["video/policy_jf"] <= 1
    # the partner of loop 1 returns masklets over every frame
    sampled = algo.rollout(algo.encode(batch))
    masks = sampled.reward_inputs[0].pred_masks
    assert len(masks) == 2 * G and all(tuple(m.shape) == (3, 64, 64) for m in masks)
    assert all(tuple(m.shape) == (3, 64, 64) for m in sampled.reward_inputs[0].gt_masks)
    assert all(tuple(m.shape) == (64, 64) for m in sampled.reward_inputs[1].pred_masks)
    # loop 2's rewards see its key frame: that frame's gt mask and pixels
    keys = [int(r) - features.video.encoded.frame_start[b] for b, r in
            enumerate(sampled.rollouts[1].replay.grounding_index[::G].tolist())]
    for n in range(2 * G):
        b = n // G
        assert torch.equal(sampled.reward_inputs[1].gt_masks[n], torch.from_numpy(batch[b].gt_masks[keys[b]]))
        assert sampled.reward_inputs[1].images[n] is batch[b].frames[keys[b]]


def test_video_old_logp_equals_the_loss_pass_bit_for_bit(video_step):
    """The loss pass (train mode, with grad) re-scores both loops' actions to the stored old_logp exactly."""
    model, _, algo, _, step = video_step
    minibatch = next(algo.minibatches(step))
    was_training = model.training
    model.train()
    try:
        tiles = model.project_vision(minibatch.features.vit_tokens)
        for part in minibatch.parts:
            logp = part.loop.action_logp(model, part.features, tiles, part.rollout, part.samples)
            assert logp.requires_grad and torch.equal(logp.detach(), part.rollout.old_logp), part.loop.name
    finally:
        model.train(was_training)


@pytest.mark.parametrize("loop", ["mask_to_caption", "caption_to_mask"])
def test_one_optimizer_step_of_each_video_loop(loop):
    model, processor = build_tiny()
    weights = dict(BOTH, mask_to_caption_weight=float(loop == "mask_to_caption"),
                   caption_to_mask_weight=float(loop == "caption_to_mask"))
    algo, _ = make_algo(model, processor, rewards(), **weights)
    step = run_rollout(algo, clips())
    assert step.rollouts[0].advantages.abs().sum() > 0, "the test reward gave every group zero spread"
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in params.items()}
    model.zero_grad(set_to_none=True)
    out = step_loss(algo, model, step)
    assert torch.isfinite(out["loss"])
    grads = {n: 0.0 if p.grad is None else float(p.grad.abs().sum()) for n, p in params.items()}
    assert all(np.isfinite(list(grads.values())))
    groups = {"lora": [v for n, v in grads.items() if "lora_" in n],
              "mlp1": [v for n, v in grads.items() if n.startswith("mlp1.")],
              "decoder": [v for n, v in grads.items() if n.startswith(DECODER)]}
    assert all(v > 0 for v in groups["lora"]), "a LoRA tensor got no gradient"
    assert any(v > 0 for v in groups["mlp1"])
    if loop == "caption_to_mask":  # the mask head on the key frame's SAM2 row
        assert any(v > 0 for v in groups["decoder"]), "no gradient reached the mask decoder"
    torch.optim.SGD(params.values(), lr=1e-2).step()
    assert any(not torch.equal(before[n], p) for n, p in params.items() if grads[n] > 0)


def test_video_jf_reward_equals_the_evaluation_metrics():
    rng = np.random.default_rng(0)
    gt = rng.random((4, 3, 9, 11)) < 0.4  # 4 rollouts, masklets [T, H, W]
    pred = rng.random((4, 3, 9, 11)) < 0.4
    pred[1] = gt[1]
    inputs = RewardInputs(sample_ids=[f"v#{n}" for n in range(4)], pred_masks=[torch.from_numpy(p) for p in pred],
                          gt_masks=list(gt))
    jf = build_reward(dict(type="video_jf"))(inputs)
    assert jf == [j_and_f(g, p) for g, p in zip(gt, pred)] and jf[1] == 1.0
    mean_j = build_reward(dict(type="video_jf", measure="j"))(inputs)
    assert mean_j == [float(np.mean(region_similarity(g, p))) for g, p in zip(gt, pred)]
    assert build_reward(dict(type="video_jf"))(dataclasses.replace(inputs, pred_masks=[None] + list(pred[1:])))[0] \
        is None
    with pytest.raises(ValueError, match="v#0"):
        build_reward(dict(type="video_jf"))(dataclasses.replace(inputs, pred_masks=[p[:, :, :5] for p in pred]))
    with pytest.raises(ValueError, match="video_jf"):  # the image reward on masklets would score frame 0 only
        IoUReward()(inputs)
    with pytest.raises(ValueError, match="measure"):
        build_reward(dict(type="video_jf", measure="f"))


def test_a_batch_that_mixes_images_and_clips_names_a_sample():
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, rewards(), **BOTH)
    clip = clips(1)[0]
    image = RegionSample(image=clip.frames[0], gt_mask=clip.gt_masks[0], captions=["a shape"], expressions=[],
                         sample_id="shapes/0#0", source="shapes")
    with pytest.raises(ValueError, match=r"shapes_video_train/0#0.*shapes/0#0"):
        algo.encode([clip, image])


def test_unpaired_clips_go_to_the_loop_they_can_feed():
    """A masklet without text (SA-V) feeds loop 1 only, a text without masklet loop 2 only."""
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, rewards(), **BOTH)
    masklet_only, text_only = clips(2)
    masklet_only = dataclasses.replace(masklet_only, captions=[], expressions=[])
    text_only = dataclasses.replace(text_only, gt_masks=None)
    features = algo.encode([masklet_only, text_only])
    assert features.video.key_frames == [key_frame(masklet_only.gt_masks), None]
    shares = algo._split_by_loop(features)
    assert shares["mask_to_caption"].sample_ids == [masklet_only.sample_id]
    assert shares["mask_to_caption"].n_tiles(shares["mask_to_caption"].image_of(0)) == 1  # the key frame, one tile
    assert shares["caption_to_mask"].sample_ids == [text_only.sample_id]
    step = run_rollout(algo, [masklet_only, text_only])
    assert [r.num_prompts for r in step.rollouts] == [1, 1]
    assert "video/policy_jf" not in step.rollouts[1].reward_stats  # no gt masklet to score the policy's against


def test_a_one_frame_clip_is_the_image_step():
    """T = 1: loop 1's key frame is the frame (one tile), the partner's masklet is its image mask; loop 2's video
    RES prompt is the one-tile image prompt and its key frame the frame. Same seed, same weights: the same
    actions, log-probs and partner outputs as the image loops on that frame, and mean J equals IoU."""
    clip = clips(1, num_frames=1, seed=3)[0]
    image = RegionSample(image=clip.frames[0], gt_mask=clip.gt_masks[0], captions=clip.captions,
                         expressions=clip.expressions, sample_id=clip.sample_id, source=clip.source)
    outputs = []
    for sample in (clip, image):
        model, processor = build_tiny()
        loop1 = [dict(type="video_jf", measure="j")] if sample is clip else [dict(type="iou")]
        # each loop scored by its own pass, as a video step is (the image step's joint pass rounds differently)
        algo, _ = make_algo(model, processor, {"mask_to_caption": loop1, "caption_to_mask": [MaskAreaReward()]},
                            num_iterations=2, joint_loop_scoring=False, **BOTH)
        features = algo.encode([sample])
        assert features.n_tiles(0) == 1, "the tiny preset must tile this frame as one tile for the comparison"
        sampled = algo.rollout(features)
        outputs.append((sampled, algo.score(sampled)))
    (video, video_scored), (still, still_scored) = outputs
    for v, s in zip(video.rollouts, still.rollouts):
        assert torch.equal(v.old_logp, s.old_logp), v.loop
        assert torch.equal(v.action_mask, s.action_mask)
    assert torch.equal(video.rollouts[0].replay.completion_ids, still.rollouts[0].replay.completion_ids)
    assert torch.equal(video.rollouts[1].replay.action, still.rollouts[1].replay.action)
    assert all(torch.equal(v[0], s) for v, s in zip(video.reward_inputs[0].pred_masks, still.reward_inputs[0].pred_masks))
    assert video.reward_inputs[1].pred_captions == still.reward_inputs[1].pred_captions
    assert torch.allclose(video_scored.rollouts[0].rewards, still_scored.rollouts[0].rewards, atol=1e-12)


def test_encoders_run_once_per_clip_and_the_loss_pass_never_propagates(monkeypatch):
    """ViT once on the MLLM frames (+ the key frame of loop 1 only where it is not one of them), SAM2 once on every
    frame (one call per clip); the SAM2 propagation runs only in the no-grad rollout (the partner's masklets and the policy_jf stat)."""
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, rewards(), **BOTH)
    first, second = clips(2)
    late = np.zeros_like(first.gt_masks)
    late[2] = first.gt_masks.any(0)  # the object only on the last frame: key frame 2, not an MLLM frame
    first = dataclasses.replace(first, gt_masks=late)
    early = np.zeros_like(second.gt_masks)
    early[0] = second.gt_masks.any(0)  # key frame 0, an MLLM frame: its tokens are reused
    second = dataclasses.replace(second, gt_masks=early)
    calls = {"vision": [], "grounding": [], "propagate": []}
    encode_vision, encode_grounding, propagate = model.encode_vision, model.encode_grounding, model.propagate_masklets
    monkeypatch.setattr(model, "encode_vision", lambda x: calls["vision"].append(len(x)) or encode_vision(x))
    monkeypatch.setattr(model, "encode_grounding",
                        lambda x, **kw: calls["grounding"].append(len(x)) or encode_grounding(x, **kw))
    monkeypatch.setattr(model, "propagate_masklets", lambda prompt, *a: calls["propagate"].append(
        torch.is_grad_enabled()) or propagate(prompt, *a))
    step = run_rollout(algo, [first, second])
    assert step.features.video.key_frames == [2, 0]
    assert calls["vision"] == [2 + 2 + 1] and calls["grounding"] == [3, 3]
    assert calls["propagate"] and not any(calls["propagate"]), "a propagation ran with grad"
    rollout_calls = len(calls["propagate"])
    out = step_loss(algo, model, step)
    assert torch.isfinite(out["loss"]) and len(calls["propagate"]) == rollout_calls, "the loss pass propagated"
    assert calls["vision"] == [5] and calls["grounding"] == [3, 3], "the loss pass re-encoded"


def test_loop2_acts_on_the_mllm_frame_where_the_policys_mask_is_largest():
    """The key frame of loop 2 is the argmax over the MLLM frames of the pixel area of the policy's deterministic
    mask, each frame decoded on its own through the image path (``decode_masks`` + ``logits_to_masks``)."""
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, rewards(), **dict(BOTH, mask_to_caption_weight=0.0, video_mllm_frames=3))
    batch = clips(2, num_frames=4, seed=5)
    step = algo.rollout(algo.encode(batch))
    features, replay = step.features, step.rollouts[0].replay
    G = algo.config.num_generations
    from projects.llava_sam2.rl_train.model.pipeline.shared import forced_answer_seg_prompts
    with torch.no_grad():
        tiles = model.project_vision(features.vit_tokens)
        prompts = forced_answer_seg_prompts(model, features, tiles, replay.prompt_ids[::G],
                                            replay.prompt_attention[::G], [0, 1], replay.answer_ids[::G],
                                            replay.seg_index[::G])
        chosen = []
        for b in range(2):
            start = features.video.encoded.frame_start[features.video.clip_index[b]]
            areas = []
            for t in range(3):
                logits = model.decode_masks(prompts[b:b + 1], features.grounding,
                                            torch.tensor([start + t])).best_logits
                areas.append(int(model.logits_to_masks(logits, [features.image_sizes[b]])[0].sum()))
            assert int(replay.grounding_index[b * G]) == start + int(np.argmax(areas)), areas
            chosen.append(int(np.argmax(areas)))
    assert any(k > 0 for k in chosen), "the fixture does not tell the choice from 'always the first frame'"


def test_unsupported_video_settings_and_bad_masklets_raise_naming_the_sample():
    model, processor = build_tiny()
    clip = clips(1)[0]
    empty = dataclasses.replace(clip, gt_masks=np.zeros_like(clip.gt_masks))
    algo, _ = make_algo(model, processor, rewards(), **BOTH)
    with pytest.raises(ValueError, match=r"shapes_video_train/0#0.*empty in every frame"):
        algo.encode([empty])
    with pytest.raises(ValueError, match=r"gt_masks has shape \(3, 64, 32\)"):
        algo.encode([dataclasses.replace(clip, gt_masks=clip.gt_masks[:, :, :32])])
    dense, _ = make_algo(model, processor, rewards(), mask_to_caption_dense_weight=0.5, **BOTH)
    with pytest.raises(ValueError, match="mask_to_caption_dense_weight=0.5 is not supported on video"):
        dense.rollout(dense.encode([clip]))
    greedy, _ = make_algo(model, processor, {"caption_to_mask": [MaskAreaReward()]}, mask_policy="deterministic",
                          **dict(BOTH, mask_to_caption_weight=0.0))
    with pytest.raises(ValueError, match="mask_policy='deterministic' is not supported on video"):
        greedy.rollout(greedy.encode([clip]))


def test_default_rewards_score_loop1_on_video_by_jf():
    """Without configured rewards, a video step's loop 1 is scored by video_jf (the image default, IoU, would
    raise on masklets); an image step keeps IoU."""
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, None, **dict(BOTH, caption_to_mask_weight=0.0))
    video = algo.score(algo.rollout(algo.encode(clips(1))))
    assert "video_jf/mean" in video.rollouts[0].reward_stats and "iou/mean" not in video.rollouts[0].reward_stats
    image = algo.score(algo.rollout(algo.encode(shapes_batch(1))))
    assert "iou/mean" in image.rollouts[0].reward_stats
