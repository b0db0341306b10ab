"""The loop-2 mask action on the tiny Sa2VA: fp32 log-densities under a bf16 model (against fp64 references), what the
partner is shown, and the mask-action benchmark (benchmarks/mask_action.py) end to end."""
from __future__ import annotations

import json

import pytest
import torch
from torch import distributions as D

from grpo_tiny import build_tiny, make_algo, one_thread, run_rollout, shapes_batch
from projects.llava_sam2.rl_train.benchmarks import mask_action
from projects.llava_sam2.rl_train.grpo.cycle import seg_mask_head
from projects.llava_sam2.rl_train.grpo.mask_policy import MASK_POLICIES
from projects.llava_sam2.rl_train.model.pipeline.region_chain import region_sample_points

_one_thread = pytest.fixture(autouse=True)(one_thread)

LOOP2_ONLY = dict(mask_to_caption_weight=0.0, caption_to_mask_weight=1.0, use_partner_captions=False)


def fp64_reference(policy, head, action):
    """log p(action) in fp64 from the head's (bf16-model) outputs, per policy."""
    decoded = head.decoded
    if policy.name == "region":
        rows = []  # the released chain in fp64, read at the region sample points
        for low_res, (H, W) in zip(decoded.best_logits.double(), head.chain.sizes):
            up = torch.nn.functional.interpolate(low_res[None, None], size=(head.chain.sam_image_size,) * 2,
                                                 mode="bilinear", align_corners=False)
            up = torch.nn.functional.interpolate(up, size=(H, W), mode="bilinear", align_corners=False)[0, 0]
            g = head.chain.grid_size
            rows.append(up[region_sample_points(H, g)][:, region_sample_points(W, g)])
        z = torch.stack(rows) / policy.temperature
        return D.Bernoulli(logits=z).log_prob(action.double()).flatten(1)
    if policy.name == "bernoulli":
        z = torch.nn.functional.avg_pool2d(decoded.best_logits.double()[:, None], policy.pool)[:, 0]
        return D.Bernoulli(logits=z / policy.temperature).log_prob(action.double()).flatten(1)
    if policy.name == "gaussian_seg":
        return D.Normal(head.seg_prompt.double(), policy.std).log_prob(action.double())
    scores = torch.logit(decoded.iou_scores.double(), eps=1e-6) / policy.temperature
    return D.Categorical(logits=scores).log_prob(action)[:, None]


@pytest.mark.parametrize("name", sorted(MASK_POLICIES))
def test_log_probs_are_fp32_and_match_fp64_under_a_bf16_model(name):
    model, processor = build_tiny()
    model.to(torch.bfloat16)
    algo, _ = make_algo(model, processor, {"caption_to_mask": [dict(type="iou")]}, mask_policy=name,
                        seg_noise_std=0.05, **LOOP2_ONLY)
    step = run_rollout(algo, shapes_batch(2))
    features, rollouts = step.features, step.rollouts
    replay, G = rollouts[0].replay, rollouts[0].group_size
    policy = algo.context.mask_policy
    with torch.no_grad():
        head = seg_mask_head(model, features, model.project_vision(features.vit_tokens), replay, range(2), G)
        assert head.seg_prompt.dtype == torch.bfloat16  # the model really runs in bf16
        log_prob = policy.log_prob(head, replay.action)
    assert log_prob.dtype == torch.float32
    # fp32 arithmetic on the model's outputs: within 1e-4 of fp64 (a bf16 log-density is off by ~1e-2; the Gaussian's
    # (e' - e) / sigma in bf16 loses the noise's low digits entirely)
    torch.testing.assert_close(log_prob.double(), fp64_reference(policy, head, replay.action), rtol=0, atol=1e-4)


def test_region_partner_input_is_the_sampled_cells():
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, {"caption_to_mask": [PredMasks()]}, **LOOP2_ONLY)
    assert algo.context.mask_policy.name == "region"  # the default
    step = run_rollout(algo, shapes_batch(2, image_size=61))
    rollouts = step.rollouts
    cells = rollouts[0].replay.action  # [N, g, g]
    assert cells.shape == (8, 8, 8) and rollouts[0].action_mask.shape == (8, 64)
    for pred_mask, grid in zip(PredMasks.seen, cells):
        assert pred_mask.shape == (61, 61)
        assert torch.equal(processor.region_cells(pred_mask, empty_region="keep"), grid.cpu())


class PredMasks:
    """Loop-2 test reward that records the masks it is shown; reward = mask area."""

    name, weight, seen = "pred_masks", 1.0, []

    def __call__(self, inputs):
        PredMasks.seen = list(inputs.pred_masks)
        return [float(m.float().mean()) for m in inputs.pred_masks]


def test_mask_action_benchmark_runs_every_variant_from_the_same_weights(tmp_path):
    out = tmp_path / "result.json"
    argv = ["--preset", "tiny", "--batch", "2", "--num-generations", "2", "--max-completion-length", "4",
            "--image-size", "64", "--variants", "before", "flags", "region_sum", "--json", str(out)]
    assert mask_action.main(argv) == 0
    variants = json.loads(out.read_text())["variants"]
    assert variants["before"]["grpo_config"]["mask_policy"] == "bernoulli"
    for name, policy, visible in [("before", "bernoulli", None), ("flags", "region", 1.0)]:
        check_result(variants[name], policy, visible)
    # same weights, batch and draws: loop 1 is identical; region_sum's loop 2 gradient is sqrt(64) = 8 x region_sqrt's
    assert variants["flags"]["mask_to_caption"]["grad_norm"] == variants["before"]["mask_to_caption"]["grad_norm"]
    ratio = (variants["region_sum"]["caption_to_mask"]["grad_norm"]["shared"]
             / variants["flags"]["caption_to_mask"]["grad_norm"]["shared"])
    assert ratio == pytest.approx(8.0, rel=1e-3)


def check_result(result, policy, visible):
    assert set(result["mask_to_caption"]["grad_norm"]) == {"llm_lora", "mlp1", "text_hidden_fcs", "sam2_mask_decoder",
                                                           "shared"}
    for name in ("llm_lora", "mlp1", "text_hidden_fcs", "sam2_mask_decoder"):
        assert result["caption_to_mask"]["grad_norm"][name] > 0, name
    assert result["mask_to_caption"]["grad_norm"]["text_hidden_fcs"] == 0  # the caption action never reaches [SEG]
    share = result["caption_to_mask"]["partner_visible_share"]
    assert share == visible if visible is not None else 0 < share < 1
    assert result["caption_to_mask"]["action_elements"] == (64 if policy == "region" else 256)
    for loop in ("mask_to_caption", "caption_to_mask"):
        after = result[loop]["after_one_step"]
        assert after["max_abs_log_ratio_action"] > 0 and 0 <= after["clip_frac_element"] <= 1
