"""GRPOLoop, EMAPartnerHook and TrainStateHook on the toy algorithm (tests/engine_toy.py), in-process, CPU.

The exact-resume test is the acceptance check of exact resume: stop after iteration 3, resume, and iterations 4-6
match an uninterrupted run bit for bit (logged values, trainable weights, EMA partner), under Runner (state in
the checkpoint) and FlexibleRunner (state in side files, as under DeepSpeed).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from mmengine.config import Config

from engine_toy import run_config, write_toy_config
from projects.llava_sam2.rl_train.engine.checkpointing import side_file, unwrap_model


def run_toy(work_dir, *, runner_type: str = "Runner", resume_from: str | None = None, **options):
    return run_config(write_toy_config(work_dir), work_dir, runner_type=runner_type, resume_from=resume_from,
                      **options)


def trainable_state(runner) -> dict[str, torch.Tensor]:
    model = unwrap_model(runner.model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_loop_hook_points_metrics_and_checkpoint_content(tmp_path):
    hooks = [dict(type="EMAPartnerHook"), dict(type="TrainStateHook"), dict(type="RewardFailureHook"),
             dict(type="RolloutLoggingHook", interval=2, max_prompts=2, max_rollouts=3)]
    runner, record = run_toy(tmp_path, **{"train_cfg.max_iters": 3, "custom_hooks": hooks})
    # after_rollout sees unscored rollouts, after_reward scored ones, in that order, once per iteration
    assert [(stage, i) for stage, i, _ in record.seen] == [
        (stage, i) for i in range(3) for stage in ("after_rollout", "after_reward")]
    assert [nan_frac for _, _, nan_frac in record.seen] == [1.0, 0.0] * 3
    logged = record.outputs[3]
    for key in ("loss", "grpo_loss", "toy/reward_mean", "toy/reward_std", "toy/frac_reward_zero_std",
                "toy/completion_length", "toy/hit/mean", "toy/judge/failures/timeout"):
        assert key in logged, key
    assert logged["loss"] == logged["grpo_loss"]
    assert runner.message_hub.get_scalar("train/toy/reward_mean").current() == logged["toy/reward_mean"]

    checkpoint = torch.load(tmp_path / "iter_3.pth", weights_only=False)
    # only the trainable head is saved; the frozen encoder comes from the model build
    assert sorted(checkpoint["state_dict"]) == ["policy.head.bias", "policy.head.weight"]
    assert checkpoint["ema_partner"]["num_updates"] == 3
    assert set(checkpoint["rng_state"]) >= {"python", "numpy", "torch"}
    assert {"optimizer", "param_schedulers"} <= set(checkpoint)

    # RewardFailureHook: the toy reports one judge timeout per iteration; run totals live in the message hub
    assert runner.message_hub.get_info("reward_failures") == {"toy/judge/failures/timeout": 3.0}
    # RolloutLoggingHook: iterations 1 and 2 (interval 2), 2 prompts x 3 rollouts each, token ids without a tokenizer
    rows = [json.loads(line) for line in open(os.path.join(runner.log_dir, "rollouts.jsonl"))]
    assert [(r["iter"], r["sample_id"] is not None, r["rollout"]) for r in rows] == [
        (i, True, g) for i in (1, 2) for _ in range(2) for g in range(3)]
    assert all(r["completion"].isdigit() for r in rows)


def test_reward_failure_hook_warns_standing_causes_never_per_iteration():
    # 'no_endpoint' (no judge configured) is the same every iteration: counted, not warned each time (the
    # reward says so once at start-up); a transient cause (timeout) is still warned when it happens
    import types

    from mmengine.logging import MessageHub

    from projects.llava_sam2.rl_train.engine.hooks.reward_hooks import RewardFailureHook

    warnings = []
    runner = types.SimpleNamespace(message_hub=MessageHub.get_instance("reward_failure_hook_test"),
                                   logger=types.SimpleNamespace(warning=warnings.append))

    def rollout(stats):
        return types.SimpleNamespace(loop="caption_to_mask", reward_stats=stats, num_rollouts=4)

    hook = RewardFailureHook()
    for i in range(3):
        hook.after_reward(runner, i, rollouts=[rollout({"dlc_judge/failures/no_endpoint": 4.0})])
    assert warnings == []
    assert runner.message_hub.get_info("reward_failures") == {"caption_to_mask/dlc_judge/failures/no_endpoint": 12.0}
    hook.after_reward(runner, 3, rollouts=[rollout({"dlc_judge/failures/no_endpoint": 3.0,
                                                    "dlc_judge/failures/timeout": 1.0})])
    assert len(warnings) == 1 and "iteration 4" in warnings[0]
    assert "timeout=1 (run total 1)" in warnings[0] and "no_endpoint" not in warnings[0]


def test_ema_partner_follows_the_policy_at_the_configured_decay(tmp_path):
    runner, _ = run_toy(tmp_path, **{"train_cfg.max_iters": 1})
    model = unwrap_model(runner.model)
    weights = runner.train_loop.algorithm.weights  # the algorithm owns the weight sets (grpo/protocol.py)
    policy = dict(model.policy.named_parameters())
    partner = weights.state_dict()["partner"]
    # one update from the starting weights W0: partner = 0.9 * W0 + 0.1 * W1, so it sits strictly between
    # (decay 0.9 in ToyTrainModel); the step moved W1 away from W0, so they differ
    W1 = policy["head.weight"].detach()
    assert weights.num_updates == 1
    assert not torch.equal(partner["head.weight"], W1)
    W0 = (partner["head.weight"] - 0.1 * W1) / 0.9
    assert torch.allclose(0.9 * W0 + 0.1 * W1, partner["head.weight"], atol=1e-6)
    assert (W1 - W0).abs().max() > 1e-3


@pytest.mark.parametrize("runner_type, storage", [("Runner", "cpu"), ("FlexibleRunner", None)])
def test_resume_after_iteration_3_reproduces_iterations_4_to_6(tmp_path, runner_type, storage):
    """Host storage (Runner case) updates the partner in the background: the checkpoint saved right after iteration
    3's update holds that update, and the resumed partner equals the uninterrupted one bit for bit."""
    options = {"model.weights_storage_device": storage}
    full_runner, full = run_toy(tmp_path / "full", runner_type=runner_type, **options)
    assert full_runner.train_loop.algorithm.weights.async_update is (storage == "cpu")
    if runner_type == "FlexibleRunner":
        # FlexibleRunner never calls the checkpoint hooks under DeepSpeed: the state lives in side files
        for name in ("ema_partner", "rng_state"):
            assert os.path.isfile(side_file(str(tmp_path / "full" / "iter_3.pth"), name)), name
        assert "ema_partner" not in torch.load(tmp_path / "full" / "iter_3.pth", weights_only=False)

    resumed_runner, resumed = run_toy(tmp_path / "full", runner_type=runner_type,
                                      resume_from=str(tmp_path / "full" / "iter_3.pth"), **options)
    assert sorted(resumed.outputs) == [4, 5, 6]
    for i in (4, 5, 6):
        assert resumed.outputs[i] == full.outputs[i], f"iteration {i} differs after resume"
    full_weights, resumed_weights = trainable_state(full_runner), trainable_state(resumed_runner)
    for name, value in full_weights.items():
        assert torch.equal(value, resumed_weights[name]), name
    full_partner = full_runner.train_loop.algorithm.weights.state_dict()["partner"]
    resumed_partner = resumed_runner.train_loop.algorithm.weights.state_dict()["partner"]
    for name, value in full_partner.items():
        assert torch.equal(value, resumed_partner[name]), f"EMA partner {name}"


def test_resume_without_rng_state_diverges(tmp_path):
    """Control for the test above: without TrainStateHook the resumed rollouts draw other samples."""
    _, full = run_toy(tmp_path, **{"custom_hooks": [dict(type="EMAPartnerHook")]})
    _, resumed = run_toy(tmp_path, resume_from=str(tmp_path / "iter_3.pth"),
                         **{"custom_hooks": [dict(type="EMAPartnerHook")]})
    assert any(resumed.outputs[i] != full.outputs[i] for i in (4, 5, 6))


def test_sft_mixing_adds_the_weighted_sft_loss_to_the_step(tmp_path):
    cfg = Config.fromfile(write_toy_config(tmp_path))
    _, record = run_toy(tmp_path, **{"train_cfg.max_iters": 2, "train_cfg.sft_dataloader": cfg.sft_dataloader,
                                     "train_cfg.sft_loss_weight": 0.5})
    logged = record.outputs[2]
    assert logged["sft_loss"] > 0
    assert logged["loss"] == pytest.approx(logged["grpo_loss"] + logged["sft_loss"], rel=1e-6)


def test_loop_rejects_bad_config(tmp_path):
    with pytest.raises(ValueError, match="sft_loss_weight"):
        cfg = Config.fromfile(write_toy_config(tmp_path))
        run_toy(tmp_path, **{"train_cfg.sft_dataloader": cfg.sft_dataloader, "train_cfg.sft_loss_weight": 0.0})


def test_skipped_sample_hook_counts_distinct_bad_samples_and_reports():
    from types import SimpleNamespace

    from mmengine.logging import MessageHub

    from projects.llava_sam2.rl_train.data.bad_samples import SkippedSample
    from projects.llava_sam2.rl_train.data.collate import RegionBatch
    from projects.llava_sam2.rl_train.engine.hooks import SkippedSampleHook

    messages = []
    runner = SimpleNamespace(message_hub=MessageHub.get_instance("skipped_sample_test"),
                             logger=SimpleNamespace(warning=messages.append, info=messages.append))
    bad = SkippedSample("coco/1#2", "ann.json", "bad_mask", "empty polygon")
    hook = SkippedSampleHook()
    hook.before_train_iter(runner, 0, RegionBatch([], [bad]))
    hook.before_train_iter(runner, 1, RegionBatch([], [bad, SkippedSample("coco/3#4", "3.jpg", "bad_image", "x")]))
    hook.before_train_iter(runner, 2, [])  # plain lists (no .skipped) are fine
    assert runner.message_hub.get_scalar("train/data/skipped_samples").current() == 2.0  # distinct ids
    hook.after_train(runner)
    assert "2 bad sample(s) skipped" in messages[-1] and "bad_mask: 1" in messages[-1]


def test_rollout_runs_in_the_amp_wrappers_autocast_like_train_steps_forward(tmp_path, monkeypatch):
    """OptimWrapper: nothing autocasts. AmpOptimWrapper: the rollout runs in the wrapper's own autocast (its dtype, or
    MMEngine's default: bf16 on CPU), the same as train_step's forward."""
    import engine_toy
    from mmengine.optim.optimizer import amp_optimizer_wrapper

    def autocast_state():
        return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None

    seen = {"rollout": [], "loss": []}
    rollout, policy_loss = engine_toy.ToyREINFORCE.rollout, engine_toy.ToyREINFORCE.policy_loss
    monkeypatch.setattr(engine_toy.ToyREINFORCE, "rollout",
                        lambda self, prompts: seen["rollout"].append(autocast_state()) or rollout(self, prompts))
    monkeypatch.setattr(engine_toy.ToyREINFORCE, "policy_loss",
                        lambda self, model, mb: seen["loss"].append(autocast_state()) or policy_loss(self, model, mb))
    run_toy(tmp_path / "plain", **{"train_cfg.max_iters": 2})
    assert set(seen["rollout"]) == {None} and set(seen["loss"]) == {None}  # OptimWrapper: nothing autocasts
    monkeypatch.setattr(amp_optimizer_wrapper, "is_cuda_available", lambda: True)  # AmpOptimWrapper asserts a GPU
    for dtype in ("bfloat16", None):
        seen["rollout"].clear(), seen["loss"].clear()
        run_toy(tmp_path / f"amp_{dtype}", **{"train_cfg.max_iters": 2, "optim_wrapper.type": "AmpOptimWrapper",
                                              "optim_wrapper.dtype": dtype})
        assert seen["rollout"] == [torch.bfloat16] * 2
        assert seen["loss"] == [torch.bfloat16] * 2  # train_step's forward: the same autocast


def test_tensorboard_backend_from_one_config_line_receives_scalars_and_rollout_images(tmp_path):
    """configs/rl/_base_/visualizers.py: `tensorboard_visualizer` as the config's visualizer sends LoggerHook's
    scalars (loss, the loop's rewards) to TensorBoard event files, one point per iteration."""
    from mmengine.config import Config
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    base = Path(__file__).resolve().parents[1] / "projects/llava_sam2/configs/rl/_base_/visualizers.py"
    shipped = Config.fromfile(str(base)).tensorboard_visualizer
    # the toy config is a string config, which holds registered names, not classes: the shipped entry by name
    visualizer = dict(type=shipped.type.__name__, vis_backends=[dict(type=b.type.__name__) for b in shipped.vis_backends])
    assert visualizer == dict(type="Visualizer", vis_backends=[dict(type="LocalVisBackend"),
                                                               dict(type="TensorboardVisBackend")])
    run_toy(tmp_path, **{"train_cfg.max_iters": 2,
                         "visualizer": dict(_delete_=True, **visualizer),  # the toy config has visualizer=None
                         "default_hooks.logger.interval": 1})
    events = sorted(tmp_path.glob("*/vis_data/events.out.tfevents.*"))
    assert events, list(tmp_path.rglob("*"))
    acc = EventAccumulator(str(events[0].parent), size_guidance={"scalars": 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    assert {"loss", "toy/reward_mean"} <= scalars, scalars
    assert [event.step for event in acc.Scalars("loss")] == [1, 2]


def test_the_loop_imports_nothing_about_precision():
    """Precision is the train model's (rollout_context / update_context): engine/loop.py imports neither peft nor an
    optimizer wrapper class, and enters only the contexts it is given."""
    import ast

    from projects.llava_sam2.rl_train.engine import loop

    tree = ast.parse(Path(loop.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names} | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name and ("peft" in name or "AmpOptimWrapper" in name
                                                       or "autocast" in name)}, sorted(imported)
