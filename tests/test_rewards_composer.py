"""RewardComposer: weighting, the three missing-value policies, concurrency of sync and async
rewards, per-term statistics, and errors."""
import asyncio
import math
import threading

import pytest
import torch

from projects.llava_sam2.rl_train.rewards import AsyncRunner, RewardComposer, RewardInputs, RewardResult, combine

NAN = float("nan")


class Fixed:
    """Sync reward returning given values."""

    def __init__(self, name, weight, values):
        self.name, self.weight, self.values = name, weight, values

    def __call__(self, inputs):
        return list(self.values)


class AsyncFixed(Fixed):
    async def __call__(self, inputs):
        await asyncio.sleep(0)
        return RewardResult(values=list(self.values), failures={"timeout": self.values.count(None)}, stats={"requests": 2})


def _inputs(n):
    return RewardInputs(sample_ids=[f"s#{i}" for i in range(n)])


@pytest.mark.parametrize("missing, expected", [
    # rollout 0: both present -> 0.25*0.4 + 0.75*0.8 = 0.7
    # rollout 1: judge missing -> renormalize: 1.0 * 0.25*0.4 / 0.25 = 0.4; zero: 0.1; nan: NaN
    # rollout 2: nothing present -> NaN under every policy
    ("renormalize", [0.7, 0.4, NAN]),
    ("zero", [0.7, 0.1, NAN]),
    ("nan", [0.7, NAN, NAN]),
])
def test_combine_policies(missing, expected):
    values = torch.tensor([[0.4, 0.4, NAN], [0.8, NAN, NAN]], dtype=torch.float64)  # [R=2, N=3]
    weights = torch.tensor([0.25, 0.75], dtype=torch.float64)
    total = combine(values, weights, missing)
    assert torch.allclose(total, torch.tensor(expected, dtype=torch.float64), equal_nan=True)


def test_renormalize_keeps_total_weight_scale():
    # weights 1 and 1 (W = 2): a missing second term leaves 2 * v1
    values = torch.tensor([[0.3], [NAN]], dtype=torch.float64)
    assert combine(values, torch.tensor([1.0, 1.0], dtype=torch.float64), "renormalize").item() == pytest.approx(0.6)


@pytest.mark.parametrize("missing, expected", [
    # weights: iou 1.0, length penalty -0.5 (TRL semantics: total = Σ w_r v_r, a negative weight penalises)
    # rollout 0: both present -> 1.0*0.8 - 0.5*0.4 = 0.6 under every policy
    # rollout 1: penalty missing -> renormalize rescales only positive weights (W = 1.0): 1.0 * 0.8 / 1.0 + 0 = 0.8;
    #            zero: 0.8
    # rollout 2: iou missing -> renormalize: no positive-weight reward to rescale, NaN; zero: -0.2
    ("renormalize", [0.6, 0.8, NAN]),
    ("zero", [0.6, 0.8, -0.2]),
    ("nan", [0.6, NAN, NAN]),
])
def test_negative_weight_penalises_with_trl_semantics(missing, expected):
    composer = RewardComposer([Fixed("iou", 1.0, [0.8, 0.8, None]), Fixed("length", -0.5, [0.4, None, 0.4])],
                              missing=missing)
    total, stats = composer.compute(_inputs(3))
    assert torch.allclose(total.double(), torch.tensor(expected, dtype=torch.float64), equal_nan=True, atol=1e-6)
    assert stats["length/mean"] == pytest.approx(0.4)  # logged as returned, before weighting


def test_a_failed_penalty_never_pays_under_renormalize():
    """Two rollouts with the same IoU: the first's penalty ran and came out 0 (no penalty), the second's failed.
    A failure must not score above it (it did: the missing penalty's |weight| went to the IoU, 1.5 * 0.8 = 1.2)."""
    composer = RewardComposer([Fixed("iou", 1.0, [0.8, 0.8, 0.5]), Fixed("length", -0.5, [0.0, None, None]),
                               Fixed("meteor", 0.5, [0.2, 0.2, None])])
    total, stats = composer.compute(_inputs(3))
    # rollout 0: 1.0*0.8 + 0.5*0.2 - 0.5*0 = 0.9; rollout 1: the same with the penalty failed = 0.9
    # rollout 2: meteor and penalty failed -> positive part 1.5 * (1.0*0.5) / 1.0 = 0.75, penalty 0 -> 0.75
    torch.testing.assert_close(total.double(), torch.tensor([0.9, 0.9, 0.75], dtype=torch.float64), atol=1e-6, rtol=0)
    assert stats["total/fallback"] == 2


def test_composer_stats_and_zero_weight_logging_only():
    composer = RewardComposer([
        Fixed("meteor", 0.25, [0.4, 0.2, 0.0]),
        AsyncFixed("judge", 0.75, [1.0, None, 0.5]),
        Fixed("dice", 0.0, [0.9, 0.9, None]),  # weight 0: logged, never in the total
    ], runner=AsyncRunner())
    total, stats = composer.compute(_inputs(3))
    assert total.dtype == torch.float32
    assert total.tolist() == pytest.approx([0.25 * 0.4 + 0.75, 0.2, 0.75 * 0.5])
    assert stats["meteor/mean"] == pytest.approx(0.2) and stats["meteor/std"] == pytest.approx(math.sqrt(0.08 / 3))
    assert stats["judge/mean"] == pytest.approx(0.75) and stats["judge/missing"] == 1
    assert stats["judge/failures/timeout"] == 1 and stats["judge/requests"] == 2
    assert stats["dice/missing"] == 1 and stats["total/fallback"] == 1 and stats["total/invalid"] == 0
    assert stats["total/mean"] == pytest.approx(sum(total.tolist()) / 3, abs=1e-6)


def test_sync_and_async_rewards_run_concurrently():
    """The async reward waits for an event that only the sync reward (in a worker thread) sets; run
    one after the other, this would time out."""
    seen_by_sync = threading.Event()

    class SyncSignals:
        name, weight = "sync", 1.0

        def __call__(self, inputs):
            seen_by_sync.set()
            return [1.0] * len(inputs)

    class AsyncWaits:
        name, weight = "async", 1.0

        async def __call__(self, inputs):
            for _ in range(500):  # up to ~5 s
                if seen_by_sync.is_set():
                    return [0.5] * len(inputs)
                await asyncio.sleep(0.01)
            raise AssertionError("sync reward never ran while the async one was pending")

    composer = RewardComposer([AsyncWaits(), SyncSignals()])  # async first: it must not block the sync one
    total, _ = composer.compute(_inputs(2))
    assert total.tolist() == pytest.approx([1.5, 1.5])


def test_composer_errors():
    with pytest.raises(ValueError, match="missing='drop'"):
        RewardComposer([Fixed("a", 1.0, [1.0])], missing="drop")
    with pytest.raises(ValueError, match="unique"):
        RewardComposer([Fixed("a", 1.0, [1.0]), Fixed("a", 1.0, [1.0])])
    with pytest.raises(ValueError, match="non-zero weight"):
        RewardComposer([Fixed("a", 0.0, [1.0])])
    with pytest.raises(ValueError, match="finite"):
        RewardComposer([Fixed("a", 1.0, [1.0]), Fixed("b", float("nan"), [1.0])])
    with pytest.raises(ValueError, match="returned 2 values for 1 rollouts"):
        RewardComposer([Fixed("a", 1.0, [1.0, 2.0])]).compute(_inputs(1))
    with pytest.raises(TypeError, match="returned str for rollout 0"):
        RewardComposer([Fixed("a", 1.0, ["high"])]).compute(_inputs(1))
    runner = AsyncRunner()

    async def inside():
        return runner.run(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="own loop"):
        runner.run(inside())
    runner.close()
