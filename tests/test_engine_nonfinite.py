"""Step guard: a NaN loss / gradient skips the step without touching weights,
optimizer state or EMA partner, is counted and logged, and K such iterations in a row (or weights made non-finite by
the step itself) stop the run with a clear error before a bad checkpoint exists. A step at a destructive learning
rate (finite loss and gradients) is undone the same way, and the documented recovery (a lower lr on resume) works.
Reward sources that return None, NaN or inf are counted, and a count logged once is 0 at a clean iteration after
it. Toy algorithm (tests/engine_toy.py), in-process, CPU.
"""
from __future__ import annotations

import copy
import glob

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook

from engine_toy import run_config, write_toy_config
from fault_tools import run_forked, train_toy, trainable_weights
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


class StepProbe(Hook):
    """The optimizer's ``step`` once the runner built the schedulers (before training) and during training."""

    def before_run(self, runner) -> None:
        self.optimizer = runner.optim_wrapper.optimizer
        self.before = self.optimizer.step

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.during = self.optimizer.step


@pytest.mark.parametrize("fail_at_iter", [None, 1])
def test_the_guard_puts_the_optimizer_step_back_when_training_ends_or_fails(tmp_path, fail_at_iter):
    """The guard wraps ``optimizer.step`` for the run only: afterwards the optimizer steps as it did before (the
    scheduler's counting wrapper), also when training stopped with an error."""
    probe = StepProbe()
    options = {"train_cfg.max_iters": 2, "train_cfg.algorithm.fail_at_iter": fail_at_iter}
    if fail_at_iter is None:
        run_config(write_toy_config(tmp_path), tmp_path, extra_hooks=[probe], **options)
    else:
        with pytest.raises(RuntimeError, match="failing on purpose"):
            run_config(write_toy_config(tmp_path), tmp_path, extra_hooks=[probe], **options)
    assert probe.during != probe.before  # guarded while training (a bound method compares by function and object)
    assert probe.optimizer.step == probe.before


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


def test_absurd_learning_rate_without_the_update_check_stops_before_a_non_finite_checkpoint(tmp_path):
    """lr so high that the step itself overflows the weights (finite gradients); with max_update_ratio=None no copy
    of the weights exists to undo the step, so the run stops at once."""
    with pytest.raises(FloatingPointError, match="optimizer step made trainable weights NaN or inf"):
        run_toy(tmp_path, **{"optim_wrapper.optimizer.lr": 1e30, "default_hooks.checkpoint.interval": 1,
                             "train_cfg.max_update_ratio": None})
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


def max_abs(weights: dict[str, torch.Tensor]) -> float:
    return max(float(value.abs().max()) for value in weights.values())


def test_destructive_learning_rate_is_undone_before_it_reaches_weights_or_checkpoints(tmp_path):
    """At lr 1e6 the step's loss and gradients are finite but it moves the weights ~1e5-fold. The
    guard puts weights and optimizer state back (update ratio > max_update_ratio), and 3 such iterations in a row stop
    the run; the checkpoints it names hold the initial weights (the unguarded run checkpointed weights of ~1e5)."""
    with pytest.raises(FloatingPointError, match="update larger than max_update_ratio=1 x the weights' norm") as err:
        run_toy(tmp_path, **{"optim_wrapper.optimizer.lr": 1e6, "default_hooks.checkpoint.interval": 1})
    assert "iteration 3" in str(err.value) and str(tmp_path / "iter_2.pth") in str(err.value)
    first, second = trainable_weights(tmp_path / "iter_1.pth"), trainable_weights(tmp_path / "iter_2.pth")
    assert_same(first, second, "no step was applied")
    assert max_abs(second) < 1.0  # nn.Linear(8, 4) starts within +-1/sqrt(8)


def test_a_normal_run_never_trips_the_update_check_and_logs_the_ratio(tmp_path):
    _, record = run_toy(tmp_path)
    ratios = [record.outputs[i]["guard/update_ratio"] for i in range(1, 7)]
    assert all(0 < ratio < 0.5 for ratio in ratios), ratios  # lr 0.05, the toy's (large) default
    assert all(record.outputs[i]["guard/skipped_steps"] == 0 for i in range(1, 7))


def test_update_ratio_limit_is_checked(tmp_path):
    with pytest.raises(ValueError, match="max_update_ratio=0"):
        run_toy(tmp_path, **{"train_cfg.max_update_ratio": 0})


def test_recovery_recipe_lower_lr_and_resume_auto_trains_on(tmp_path):
    """docs/failure_behaviour.md "Recovering from a diverged run", as a user types it: the run at a destructive lr
    stops; `sa2va-rl train CONFIG --cfg-options optim_wrapper.optimizer.lr=5e-4 --resume auto` resumes from the
    checkpoint the error names with the new lr (it used to keep the checkpoint's 1e6) and trains to the end with
    finite weights of normal size. The lr it ends with is the one a run started at 5e-4 ends with."""
    from projects.llava_sam2.rl_train.cli.train import main as train_main

    config = write_toy_config(tmp_path / "cfg")

    def train(work_dir, lr: str, *extra: str) -> int:
        # a distinct experiment name per run: MMEngine keys the message hub by it (two runs in one second share one)
        return train_main([config, "--work-dir", str(work_dir), "--cfg-options", f"optim_wrapper.optimizer.lr={lr}",
                           "default_hooks.checkpoint.interval=1", f"experiment_name=lr{lr}_{work_dir.name}", *extra])

    with pytest.raises(FloatingPointError, match="The newest complete checkpoint is .*iter_2.pth"):
        train(tmp_path / "run", "1e6")
    assert train(tmp_path / "run", "5e-4", "--resume", "auto") == 0
    final = torch.load(tmp_path / "run" / "iter_6.pth", weights_only=False)
    assert_finite(final["state_dict"], "iter_6.pth")
    assert max_abs(final["state_dict"]) < 2.0
    logged = "".join(open(path).read() for path in glob.glob(str(tmp_path / "run" / "*" / "*.log")))
    assert "optim_wrapper.optimizer.lr=0.0005 differs from the lr the checkpoint was saved with (1e+06)" in logged

    assert train(tmp_path / "fresh", "5e-4") == 0
    fresh = torch.load(tmp_path / "fresh" / "iter_6.pth", weights_only=False)
    for resumed_group, fresh_group in zip(final["optimizer"]["param_groups"], fresh["optimizer"]["param_groups"]):
        assert resumed_group["initial_lr"] == pytest.approx(fresh_group["initial_lr"], rel=1e-12)
        assert resumed_group["lr"] == pytest.approx(fresh_group["lr"], rel=1e-12)


def test_a_failure_cause_logged_once_is_zero_at_a_clean_iteration_after_it(tmp_path):
    """The composer reports only the causes it saw, and MMEngine's message hub keeps a name's last
    value, so iteration 3 logged iteration 2's failure count again; also after a resume from iteration 2."""
    hooks = [dict(type="EMAPartnerHook"), dict(type="TrainStateHook"), dict(type="RewardFailureHook")]
    options = {"train_cfg.algorithm.flaky_reward_at": (2,), "train_cfg.max_iters": 3, "custom_hooks": hooks,
               "default_hooks.checkpoint.interval": 2}
    runner, record = run_toy(tmp_path, **options)
    key = "toy/flaky/failures/invalid_answer"
    assert [record.outputs[i].get(key) for i in (1, 2, 3)] == [None, 1, 0]
    assert runner.message_hub.get_scalar(f"train/{key}").current() == 0  # what LoggerHook prints at iteration 3
    resumed_runner, resumed = run_toy(tmp_path, resume_from=str(tmp_path / "iter_2.pth"), **options)
    assert resumed.outputs[3][key] == 0
    assert resumed_runner.message_hub.get_scalar(f"train/{key}").current() == 0


def test_two_ranks_undo_the_same_destructive_steps_and_stop_together(tmp_path):
    """The update ratio is reduced over the ranks before the decision, so both gloo ranks undo the same steps and
    stop at the same iteration with the same message (no rank waits in a collective the other left)."""
    codes = run_forked(train_toy, world=2, work_dir=str(tmp_path), tag="lr1e6",
                       **{"optim_wrapper.optimizer.lr": 1e6, "default_hooks.checkpoint.interval": 1})
    assert codes == [1, 1]
    messages = [(tmp_path / f"lr1e6.{rank}.error").read_text() for rank in (0, 1)]
    assert all("iteration 3" in m and "update larger than max_update_ratio" in m for m in messages), messages
    assert_same(trainable_weights(tmp_path / "iter_1.pth"), trainable_weights(tmp_path / "iter_2.pth"), "no step")


def test_a_new_lr_on_resume_reaches_the_schedule_when_the_checkpoint_holds_no_optimizer_state(tmp_path):
    """Checkpoints without optimizer state (the SFT configs' save_optimizer=False): the optimizer is rebuilt with the
    config's lr and only the restored schedulers are rescaled (they used to keep the checkpoint's base lr)."""
    options = {"default_hooks.checkpoint.save_optimizer": False, "train_cfg.max_iters": 3}
    run_toy(tmp_path, **options)
    runner, _ = run_toy(tmp_path, resume_from=str(tmp_path / "iter_3.pth"),
                        **{**options, "train_cfg.max_iters": 4, "optim_wrapper.optimizer.lr": 0.01})
    assert [group["initial_lr"] for group in runner.optim_wrapper.optimizer.param_groups] == [0.01]
    for scheduler in runner.param_schedulers:
        assert scheduler.base_values == pytest.approx([0.01], rel=1e-12), type(scheduler).__name__
