"""The demo pipeline, shortened: GRPO from the committed pretrained tiny Sa2VA must raise the training reward by more
than a noise margin measured at learning rate 0 (the demo's learning regression test): on the
domain demo's unpaired target data (what `make demo` runs) loop 1's reward here; on the same-domain paired data both
loops' in tests/test_demo_pipeline_same_domain.py. Both are marked `demo`: `make demo` runs them, `make test` does not.

The demo's own stages (demo/pipeline.py) run as ``make demo`` runs them: the shapes world written as COCO files
(in-process), then ``sa2va-rl train`` of the demo GRPO config from ``assets/tiny_shapes_pretrained`` as a subprocess,
then ``sa2va-rl export``. The rewards are read from the run's MMEngine ``scalars.json`` (what LoggerHook wrote), not
recomputed.

Shortened settings: the same PROMPTS training scenes in every batch (each point of the reward curve scores the same
prompts, so a rising mean is learning, not easier batches), G = 4, captions of at most 12 tokens, a larger step
than the demo's, no KL term (it would add the reference pass). The rise of a loop = mean training reward over the last WINDOW iterations − over the first WINDOW.

The margins (MARGINS) come from six seeds of this very run (docs/demo.md, "The CI test";
``python -m research.demo_test_margins --seeds 0 1 2 3 4 5``, run with
research/plans/demo_round2.txt and demo_round3.txt): the same run at learning rate 0 measures the noise of
the rise (sampling only: the policy and the EMA partner stay the pretrained model), and each margin is above the
largest null rise of its loop (loop 1: +0.047 -> 0.05; loop 2: +0.035 -> 0.04). Learning rises over the six seeds:
loop 1 +0.070 +0.088 +0.050 +0.065 +0.100 +0.112, loop 2 +0.075 +0.072 +0.107 +0.030 +0.089 +0.007, so learning
clears the margins on 5 and 4 of 6 seeds (above its own seed's null rise on all six, by +0.05 to +0.12 and +0.02 to
+0.07). The test pins seed 0 (CPU runs are deterministic) as a regression check of the whole pipeline.
"""
from __future__ import annotations

import json

import pytest

from demo_short import DOMAIN_DATA, DOMAIN_MARGINS, RL_ITERS, WINDOW, short_demo
from projects.llava_sam2.rl_train.demo.summary import reward_trend


@pytest.fixture(scope="module")
def domain_run(tmp_path_factory):
    return short_demo(tmp_path_factory.mktemp("domain"), data=DOMAIN_DATA)


@pytest.mark.demo  # an 80-90 s training pipeline: `make demo` runs it (make test stays under its 10-minute budget)
def test_domain_demo_grpo_raises_loop1_training_reward_beyond_noise(domain_run):
    settings, records = domain_run
    train, _ = records["rl"]["commands"]
    assert settings.rl_config.endswith("grpo_shapes_unpaired_cpu.py")
    assert f"train_dataloader.dataset.regions.ann_file={settings.path('data/rl_regions/annotations.json')}" in \
        train["command"]
    trend = reward_trend(settings.path("rl"), window=WINDOW)
    for key, margin in DOMAIN_MARGINS.items():
        rise = trend[key]["last"] - trend[key]["first"]
        assert trend[key]["n"] == RL_ITERS and rise > margin, (
            f"{key}: rise {rise:+.4f} over {RL_ITERS} iterations on the unpaired target data, not above the noise "
            f"margin {margin}")


def test_reward_trend_reports_the_loops_the_run_trained(tmp_path):
    """Loop 1 alone (loop 2's weight 0) logs no loop-2 reward: the trend covers loop 1 instead of raising."""
    path = tmp_path / "rl" / "20250101_000000" / "vis_data" / "scalars.json"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps({"mask_to_caption/reward_mean": float(step), "step": step}) + "\n"
                            for step in range(1, 9)))
    trend = reward_trend(tmp_path / "rl")
    assert list(trend) == ["mask_to_caption/reward_mean"]
    assert trend["mask_to_caption/reward_mean"]["first"] == 1.5 and trend["mask_to_caption/reward_mean"]["last"] == 7.5
    path.write_text(json.dumps({"lr": 1.0, "step": 1}) + "\n")
    with pytest.raises(ValueError, match="none of"):
        reward_trend(tmp_path / "rl")
