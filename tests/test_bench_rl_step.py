"""benchmarks/rl_step.py (`sa2va-rl bench rl-step`) on the tiny preset (CPU): ours plus both baselines and the
profiler table in one run, and the module state it patches is restored afterwards (no timing asserts: speed goes
to docs/benchmarks.md)."""
import json

import pytest

from grpo_tiny import one_thread
from projects.llava_sam2.rl_train.benchmarks import rl_step as bench
from projects.llava_sam2.rl_train.grpo import cycle
from projects.llava_sam2.rl_train.model.decoding.fast_decode_step import TokenChooser
from projects.llava_sam2.rl_train.model.decoding.fast_generation import DECODE_BACKENDS

_one_thread = pytest.fixture(autouse=True)(one_thread)


def test_bench_rl_step_runs_ours_and_both_baselines_on_cpu(tmp_path):
    """The realistic mode: partner answers forced to 'Sure, [SEG].' + stop (every loop-1 rollout decodes a mask, in
    ours and both baselines) and captions stopped at 2-3 tokens; a sweep point; everything patched is restored."""
    before = {name: getattr(cycle, name) for name in ("sample_text", "partner_segment", "completion_texts")}
    backends, choose = dict(DECODE_BACKENDS), TokenChooser.__call__
    out, prof = tmp_path / "rl.json", tmp_path / "prof.json"
    result = bench.run_benchmark(["--preset", "tiny", "--batch", "2", "--num-generations", "2",
                                  "--max-new-tokens", "4", "--warmup", "0", "--iters", "1", "--naive-samples", "1",
                                  "--storage", "cpu", "--force-seg", "--caption-lengths", "2,3",
                                  "--prompt-length-multiple", "64", "--completion-length-multiple", "4",
                                  "--baseline-warmup", "0", "--sweep", "G=4 amp=bfloat16,logprob=fused T=8", "--sweep-warmup", "0",
                                  "--profile", str(prof), "--json", str(out)])
    assert {name: getattr(cycle, name) for name in before} == before and DECODE_BACKENDS == backends
    assert TokenChooser.__call__ is choose
    assert set(result["baselines"]) == {"generate", "naive"}
    # --warmup 0: the one timed iteration is the process's first, the cold one; no later (warm) iteration
    assert result["iteration_step_s"] == [result["cold_step_s"]] and result["warm_step_s"] is None
    assert result["cold_step_s"] == pytest.approx(result["seconds_per_iteration"])
    assert result["prompt_length_multiple"] == 64 and result["completion_length_multiple"] == 4
    for variant in (result, *result["baselines"].values()):
        tokens = variant["tokens_per_iteration"]
        assert tokens["partner_no_seg"] == 0  # the forced answer's [SEG] was fed back in every loop-1 rollout
        assert 2 * 4 <= tokens["policy_caption_tokens"] <= 3 * 4  # 4 captions of 2-3 tokens (naive: extrapolated)
    sweep = result["sweep"]["G=4"]
    assert sweep["num_generations"] == 4 and sweep["rollouts_per_s"] > 0
    assert sweep["tokens_per_iteration"]["policy_caption_tokens"] <= 3 * 8
    # CPU default: no autocast; the amp point runs rollout and loss forward under bf16 autocast (GRPOLoop's AMP path)
    assert result["amp_dtype"] == "none" and sweep["amp_dtype"] == "none"
    # the fused LM-head log-prob path (GRPOConfig.logprob_head) runs the step under autocast too
    fused = result["sweep"]["amp=bfloat16,logprob=fused"]
    assert fused["amp_dtype"] == "bfloat16" and fused["logprob_head"] == "fused" and fused["rollouts_per_s"] > 0
    assert result["logprob_head"] == sweep["logprob_head"] == "reference"
    # a T point scales the forced caption lengths with T (2-3 at T = 4 -> 4-6 at T = 8), then restores them
    longer = result["sweep"]["T=8"]
    assert longer["caption_lengths"] == (4, 6) and 4 * 4 <= longer["tokens_per_iteration"]["policy_caption_tokens"] <= 4 * 6
    assert result["sweep"]["G=4"]["caption_lengths"] == (2, 3)
    for variant in (result, *result["baselines"].values()):
        assert variant["rollouts_per_s"] > 0 and variant["tokens_per_iteration"]["policy_caption_tokens"] > 0
        assert {"encode", "rollout", "logprob_backward", "optimizer", "ema_partner"} <= set(variant["seconds"])
    naive = result["baselines"]["naive"]
    assert naive["extrapolated_from_rollouts"] == 1
    # N / K = 4: per-rollout phases are scaled, per-iteration ones are not
    assert naive["seconds"]["encode"] == pytest.approx(4 * naive["seconds_measured"]["encode"])
    assert naive["seconds"]["optimizer"] == naive["seconds_measured"]["optimizer"]
    assert naive["tokens_per_iteration"]["policy_caption_tokens"] in (4 * 2, 4 * 3)  # 1 caption, extrapolated to 4
    assert result["partner_reference_device_gib"] == 0.0 < result["partner_reference_swap_gib"]
    assert json.loads(out.read_text())["seconds_per_iteration"] == result["seconds_per_iteration"]
    table = json.loads(prof.read_text())
    assert table["top"] and all(row["count"] > 0 for row in table["top"])
    assert {row["name"] for row in table["phases"]} >= {"encode", "rollout", "logprob_backward"}


def test_cold_and_warm_split_the_timed_iterations():
    """Cold = the first timed iteration of a run without warm-up; warm = the mean of the ones after it."""
    assert bench.cold_and_warm([3.0, 1.0, 2.0], warmup=0, num_rollouts=6) == {
        "cold_step_s": 3.0, "warm_step_s": 1.5, "cold_rollouts_per_s": 2.0, "warm_rollouts_per_s": 4.0}
    after_warmup = bench.cold_and_warm([1.0, 3.0], warmup=1, num_rollouts=4)
    assert after_warmup["cold_step_s"] is None and after_warmup["warm_step_s"] == 2.0
    assert bench.cold_and_warm([5.0], warmup=0, num_rollouts=4)["warm_step_s"] is None


def test_sweep_point_rejects_an_unknown_amp_dtype_or_logprob_head():
    assert bench.sweep_point("amp=none,G=4") == {"amp_dtype": "none", "num_generations": 4}
    assert bench.sweep_point("logprob=fused") == {"logprob_head": "fused"}
    with pytest.raises(ValueError, match="amp=int8"):
        bench.sweep_point("amp=int8")
    with pytest.raises(ValueError, match="logprob=liger"):
        bench.sweep_point("logprob=liger")


def test_repeated_sweep_points_keep_every_result():
    args = bench.parse_args(["--sweep", "amp=none amp=bfloat16 amp=none G=4 amp=none"])
    assert [label for label, _ in args.sweep] == ["amp=none", "amp=bfloat16", "amp=none #2", "G=4", "amp=none #3"]
    assert args.sweep[2][1] == {"amp_dtype": "none"}


def test_bench_rl_step_video_runs_the_video_step_on_cpu(tmp_path):
    """--video: clips of 3 frames (2 seen by the LM), both loops, the partner's loop-1 answers forced through [SEG]
    (so every masklet is propagated and scored by J&F); the naive baseline is refused (image-only)."""
    before = {name: getattr(cycle, name) for name in ("partner_segment", "partner_segment_video")}
    result = bench.run_benchmark(["--video", "--preset", "tiny", "--batch", "2", "--num-generations", "2",
                                  "--mllm-frames", "2", "--sam-frames", "3", "--image-size", "64",
                                  "--max-new-tokens", "4", "--warmup", "0", "--iters", "1", "--storage", "cpu",
                                  "--force-seg", "--caption-lengths", "2,3", "--baselines", "",
                                  "--json", str(tmp_path / "video.json")])
    assert {name: getattr(cycle, name) for name in before} == before
    assert result["video"] and result["n_tiles"] == 2 and result["baselines"] == {}
    for variant in (result,):
        assert variant["tokens_per_iteration"]["partner_no_seg"] == 0
        assert variant["rollouts_per_s"] > 0 and "peak_gib" in variant  # NaN on CPU (no device allocator)
        assert {"encode", "rollout", "rollout/mask_to_caption_partner_segment", "logprob_backward",
                "optimizer"} <= set(variant["seconds"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--video", "--baselines", "naive"])
