"""Non-finite guard (issue #13 item 1): a NaN loss / gradient skips the step without touching weights, optimizer
state or EMA partner, is counted and logged, and K such iterations in a row (or weights made non-finite by the
step itself) stop the run with a clear error before a bad checkpoint exists. Reward sources that return None,
NaN or inf are counted and training goes on. Toy algorithm (tests/engine_toy.py), in-process, CPU.
"""
from __future__ import annotations

import copy

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook

from engine_toy import run_config, write_toy_config
from fault_tools import trainable_weights
from grpo_tiny import one_thread
from projects.llava_sam2.rl_train.engine.checkpointing import unwrap_model

_one_thread = pytest.fixture(autouse=True)(one_thread)


class StateProbe(Hook):
    """Trainable weights, optimizer state and EMA partner before and after every iteration."""

    priority = "LOWEST"

    def __init__(self) -> None:
        self.before, self.after = {}, {}

    @staticmethod
    def _state(runner) -> dict:
        model = unwrap_model(runner.model)
        weights = runner.train_loop.algorithm.weights
        return {"policy": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "optimizer": copy.deepcopy(runner.optim_wrapper.optimizer.state_dict()["state"]),
                "partner": {k: v.clone() for k, v in weights.state_dict()["partner"].items()} if weights else {},
                "partner_updates": weights.num_updates if weights else 0}

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.before[batch_idx + 1] = self._state(runner)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.after[batch_idx + 1] = self._state(runner)


def run_toy(work_dir, probe: bool = False, resume_from: str | None = None, **options):
    return run_config(write_toy_config(work_dir), work_dir, resume_from=resume_from,
                      extra_hooks=[StateProbe()] if probe else [], **options)


def probe_of(runner) -> StateProbe:
    return next(h for h in runner.hooks if isinstance(h, StateProbe))


def assert_same(a, b, what: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for key in a:
            assert_same(a[key], b[key], f"{what}.{key}")
    elif torch.is_tensor(a):
        assert torch.equal(a, b), what
    else:
        assert a == b, what


def assert_finite(weights: dict[str, torch.Tensor], what: str) -> None:
    for name, value in weights.items():
        assert torch.isfinite(value).all(), f"{what}: {name} holds NaN/inf"


def test_nan_loss_skips_the_step_and_leaves_weights_optimizer_and_partner_untouched(tmp_path):
    runner, record = run_toy(tmp_path, probe=True, **{"train_cfg.algorithm.nan_loss_at": (3,)})
    probe = probe_of(runner)
    assert_same(probe.after[3], probe.before[3], "iteration 3 (NaN loss)")  # policy, Adam moments, partner
    assert probe.after[2]["partner_updates"] == 2 and probe.after[3]["partner_updates"] == 2
    for i in (2, 4):  # the iterations around it did step
        assert not torch.equal(probe.after[i]["policy"]["policy.head.weight"],
                               probe.before[i]["policy"]["policy.head.weight"]), i
    assert [record.outputs[i]["guard/skipped_steps"] for i in range(1, 7)] == [0, 0, 1, 0, 0, 0]
    assert [record.outputs[i]["guard/applied_steps"] for i in range(1, 7)] == [1, 1, 0, 1, 1, 1]
    assert record.outputs[3]["loss"] != record.outputs[3]["loss"]  # the NaN is logged, not hidden
    for step in (3, 6):
        assert_finite(trainable_weights(tmp_path / f"iter_{step}.pth"), f"iter_{step}.pth")

    # resume after the skipped iteration reproduces the rest of the run exactly
    _, resumed = run_toy(tmp_path, resume_from=str(tmp_path / "iter_3.pth"),
                         **{"train_cfg.algorithm.nan_loss_at": (3,)})
    assert sorted(resumed.outputs) == [4, 5, 6]
    for i in (4, 5, 6):
        assert resumed.outputs[i] == record.outputs[i], i


def test_consecutive_nonfinite_iterations_stop_with_a_clear_error(tmp_path):
    options = {"train_cfg.algorithm.nan_loss_at": (2, 3, 4, 5, 6), "train_cfg.max_consecutive_skips": 3}
    with pytest.raises(FloatingPointError) as err:
        run_toy(tmp_path, **options)
    message = str(err.value)
    assert "iteration 4" in message and "3 such iteration(s) in a row (limit 3)" in message
    assert "Training stopped" in message and "iter_3.pth" in message and "--resume auto" in message
    # the checkpoint of iteration 3 holds the weights after iteration 1, the last step that ran; none after it
    assert sorted(p.name for p in tmp_path.glob("iter_*.pth")) == ["iter_3.pth"]
    assert_finite(trainable_weights(tmp_path / "iter_3.pth"), "iter_3.pth")


def test_absurd_learning_rate_stops_before_a_non_finite_checkpoint(tmp_path):
    """The issue's case: lr so high that the step itself overflows the weights (finite gradients)."""
    with pytest.raises(FloatingPointError, match="optimizer step made trainable weights NaN or inf"):
        run_toy(tmp_path, **{"optim_wrapper.optimizer.lr": 1e30, "default_hooks.checkpoint.interval": 1})
    kept = sorted(tmp_path.glob("iter_*.pth"))
    assert kept, "the iteration before the overflow was checkpointed"
    for path in kept:
        assert_finite(trainable_weights(path), path.name)
    assert (tmp_path / "last_checkpoint").read_text().strip() == str(kept[-1])


def test_nan_in_the_mixed_sft_loss_is_skipped_too(tmp_path):
    cfg = Config.fromfile(write_toy_config(tmp_path))
    runner, record = run_toy(tmp_path, probe=True, **{
        "train_cfg.max_iters": 3, "train_cfg.sft_dataloader": cfg.sft_dataloader, "model.nan_sft_at": (2,)})
    probe = probe_of(runner)
    assert_same(probe.after[2], probe.before[2], "iteration 2 (NaN SFT loss)")
    assert [record.outputs[i]["guard/skipped_steps"] for i in (1, 2, 3)] == [0, 1, 0]
    assert record.outputs[3]["sft_loss"] > 0
    assert_finite(probe.after[3]["policy"], "policy after iteration 3")


def test_reward_sources_returning_none_nan_inf_are_counted_and_training_goes_on(tmp_path):
    hooks = [dict(type="EMAPartnerHook"), dict(type="TrainStateHook"), dict(type="RewardFailureHook")]
    options = {"train_cfg.algorithm.flaky_reward_at": (2,), "train_cfg.max_iters": 4, "custom_hooks": hooks,
               "default_hooks.checkpoint.interval": 2}
    runner, record = run_toy(tmp_path, **options)
    logged = record.outputs[2]
    assert logged["toy/flaky/missing"] == 1  # None
    assert logged["toy/flaky/failures/invalid_answer"] == 1
    assert logged["toy/total/invalid"] == 1  # the inf total
    assert logged["toy/frac_unscored"] == pytest.approx(1 / 8)  # inf counts as unscored: advantage 0
    assert logged["guard/skipped_steps"] == 0 and logged["loss"] == logged["loss"]  # finite loss, step taken
    assert runner.message_hub.get_info("reward_failures")["toy/flaky/failures/invalid_answer"] == 1
    assert_finite({k: v for k, v in unwrap_model(runner.model).state_dict().items()}, "policy")
    _, resumed = run_toy(tmp_path, resume_from=str(tmp_path / "iter_2.pth"), **options)
    assert resumed.outputs == {i: record.outputs[i] for i in (3, 4)}


def test_guard_rejects_a_bad_limit(tmp_path):
    with pytest.raises(ValueError, match="max_consecutive_skips=0"):
        run_toy(tmp_path, **{"train_cfg.max_consecutive_skips": 0})
