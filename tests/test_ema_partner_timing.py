"""When the EMA partner updates: once per GRPO iteration, after all of the iteration's optimizer steps.

The partner is read only while rollouts are scored, once per iteration, so its horizon is counted in iterations:
with ``num_iterations`` passes or several minibatches the decay means the same thing as with one optimizer step
(docs: grpo/config.py ``ema_decay``). Checked with three optimizer steps per iteration on the toy GRPO run.
"""
from __future__ import annotations

import torch
from engine_toy import run_config, write_toy_config
from mmengine.hooks import Hook

from projects.llava_sam2.rl_train.engine.checkpointing import unwrap_model


class PolicySnapshots(Hook):
    """The trainable policy tensors before training and after each iteration (after every other hook)."""

    priority = "LOWEST"

    def __init__(self) -> None:
        self.snapshots: list[dict[str, torch.Tensor]] = []

    def _take(self, runner) -> None:
        policy = unwrap_model(runner.model).policy
        self.snapshots.append({n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad})

    def before_train(self, runner) -> None:
        self._take(runner)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self._take(runner)


def test_partner_updates_once_per_iteration_after_all_its_optimizer_steps(tmp_path):
    snapshots = PolicySnapshots()
    options = {"train_cfg.max_iters": 2, "train_cfg.algorithm.num_iterations": 3, "default_hooks.checkpoint.interval": 10}
    runner, _ = run_config(write_toy_config(tmp_path), tmp_path, extra_hooks=[snapshots], **options)
    optimizer = runner.optim_wrapper.optimizer
    assert {int(state["step"]) for state in optimizer.state.values()} == {6}  # 3 optimizer steps per iteration
    weights = runner.train_loop.algorithm.weights
    assert weights.num_updates == 2
    decay = weights.ema_decay  # 0.9 in the toy model
    initial, *after_iterations = snapshots.snapshots
    expected = dict(initial)
    for policy in after_iterations:  # partner <- partner + (1 - decay) (policy - partner), once per iteration
        expected = {n: expected[n] + (1 - decay) * (policy[n] - expected[n]) for n in expected}
    partner = weights.state_dict()["partner"]
    assert set(partner) == set(expected)
    for name in expected:
        torch.testing.assert_close(partner[name], expected[name], rtol=0, atol=1e-7, msg=name)
