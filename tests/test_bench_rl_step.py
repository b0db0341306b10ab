"""benchmarks/rl_step.py (`sa2va-rl bench rl-step`) on the tiny preset (CPU): ours plus both baselines and the
profiler table in one run, and the module state it patches is restored afterwards (no timing asserts: speed goes
to docs/benchmarks.md)."""
import json
from pathlib import Path

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
                                  "--baseline-warmup", "0", "--sweep", "G=4 amp=bfloat16,logprob=fused T=8,ema=sync", "--sweep-warmup", "0",
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
    longer = result["sweep"]["T=8,ema=sync"]
    # host storage updates the partner in the background; the ema=sync point runs the lerp inside update_partner
    assert sweep["ema_update"] == "async" and longer["ema_update"] == "sync"
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


def _qwen_vl_run(tmp_path, *extra):
    return bench.run_benchmark(["--preset", "tiny_qwen3vl", "--batch", "2", "--num-generations", "2",
                                "--max-new-tokens", "4", "--warmup", "0", "--iters", "1", "--storage", "cpu",
                                "--force-seg", "--caption-lengths", "2,3", "--json", str(tmp_path / "qwen.json"),
                                *extra])


def test_bench_rl_step_runs_loop_2_on_the_tiny_qwen_vl_preset(tmp_path):
    """The Qwen-VL family (Sa2VAQwenModel, its processor, LoRA on the text decoder) through the same step: loop 2's
    phases are timed, its 2 x 2 rollouts counted, and the partner's captions, decoded by the fast decoder on the
    family seam, stop at the forced 2-3 tokens."""
    pytest.importorskip("transformers", minversion="4.57")
    before = {name: getattr(cycle, name) for name in ("sample_text", "partner_segment", "partner_describe")}
    result = _qwen_vl_run(tmp_path, "--loops", "caption_to_mask")
    assert {name: getattr(cycle, name) for name in before} == before
    assert result["family"] == "qwen_vl" and result["baselines"] == {} and result["loops"] == "caption_to_mask"
    # 224 px under the tiny presets' budget (at most 16·28² px): 96 x 96 px = 6 x 6 patches of 16 px, merged 2 x 2
    assert result["image_tokens_per_prompt"] == result["n_tiles"] == 9
    assert {"encode", "rollout", "rollout/caption_to_mask_partner_describe",
            "rollout/caption_to_mask_reference_scoring", "rewards", "logprob_backward", "optimizer",
            "ema_partner"} <= set(result["seconds"])
    assert not any(k.startswith("rollout/mask_to_caption") for k in result["seconds"])
    assert result["rollouts_per_s"] == pytest.approx(2 * 2 / result["seconds_per_iteration"])
    assert 2 * 4 <= result["tokens_per_iteration"]["partner_caption_tokens"] <= 3 * 4  # free: 4 x 4 tokens
    assert result["trainable_params"] > 0 and result["partner_reference_device_gib"] == 0.0


def test_bench_rl_step_default_on_the_qwen_vl_family_runs_both_loops_or_names_the_refusing_loop(tmp_path):
    """The default (both loops) on the family: with loop 1 built for it, a dual-loop step whose forced partner answers
    all reach [SEG]; without, a stop naming the refused part and the --loops run that works (no traceback)."""
    pytest.importorskip("transformers", minversion="4.57")
    try:
        result = _qwen_vl_run(tmp_path, "--baselines", "")
    except SystemExit as stop:
        message = str(stop)
        assert "does not run on --preset tiny_qwen3vl" in message and "--loops caption_to_mask" in message
        return
    assert result["loops"] == "both" and result["tokens_per_iteration"]["partner_no_seg"] == 0
    assert 2 * 4 <= result["tokens_per_iteration"]["policy_caption_tokens"] <= 3 * 4
    assert {"rollout/mask_to_caption_total", "rollout/caption_to_mask_total"} <= set(result["seconds"])
    assert result["rollouts_per_s"] == pytest.approx(2 * 2 * 2 / result["seconds_per_iteration"])


@pytest.mark.parametrize("flags, reason", [
    (["--mask-policy", "region"], "use --mask-policy bernoulli"),
    (["--baselines", "generate"], "needs its M-RoPE positions"),
    (["--baselines", "naive"], "no Qwen-VL path"),
    (["--video"], "InternVL family only"),
    (["--sweep", "tiles=13"], "image token count"),
])
def test_qwen_vl_presets_refuse_what_the_family_cannot_take_with_the_reason(flags, reason, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--preset", "qwen3vl_4b", *flags])
    assert reason in capsys.readouterr().err
    assert bench.parse_args(["--preset", "qwen3vl_4b"]).baselines == ""  # no baseline by default on this family


def test_forced_answers_reach_generate_called_with_input_ids():
    """The partner's forced answer inside transformers' generate given a prompt of L ids (the Qwen-VL family's decoder):
    the scripted columns count from the first new token, not from the prompt's start."""
    pytest.importorskip("transformers", minversion="4.57")
    import torch
    from projects.llava_sam2.rl_train.benchmarks.step_clock import ForcedAnswers, PhaseClock
    from projects.llava_sam2.rl_train.model.decoding.text_decoding import TextDecoding
    from projects.llava_sam2.rl_train.model.pipeline.shared import SEG_ANSWER, encode_images, seg_answer_ids
    from projects.llava_sam2.rl_train.model.pipeline.qwen_vl_decode import qwen_vl_completions
    from grpo_tiny import shapes_batch

    torch.manual_seed(0)
    model, processor = bench.build_qwen_vl("tiny_qwen25vl", torch.device("cpu"), torch.float32, 4, False)
    sample = shapes_batch(1)[0]
    encoded = encode_images(model, processor, [sample.image], ["s0"])
    ids, attention = processor.tokenize_prompts([processor.segment_prompt(encoded.n_tiles(0), "the shape")])
    decoding = TextDecoding.from_processor(processor)
    answer = seg_answer_ids(processor.tokenizer, SEG_ANSWER, model.seg_token_id)[0].tolist()
    clock = PhaseClock(torch.device("cpu"))
    forced = ForcedAnswers(clock, decoding.stop_token_ids[0], seg_answer=answer)
    with forced.installed_in_generate(model.model), clock("rollout/mask_to_caption_partner_segment"):
        out = qwen_vl_completions(model, encoded, [0], ids, attention, decoding, max_new_tokens=len(answer) + 3,
                                  return_hidden=False)
    assert "generate" not in vars(model.model)  # the class's method again
    assert out.ids[0][out.completion_mask[0]].tolist() == answer + [decoding.stop_token_ids[0]]


def test_forced_caption_lengths_reach_the_reference_decoder():
    """The reference decoder (``sample_completions``, the Qwen-VL family's loop-1 policy sampling) under forcing:
    inside a policy-sampling phase every caption stops at the drawn length, each call with a fresh table; outside
    it, and after the block, decoding is free again."""
    import torch
    from projects.llava_sam2.rl_train.benchmarks.step_clock import ForcedAnswers, PhaseClock
    from projects.llava_sam2.rl_train.model.decoding import generation
    from grpo_tiny import build_tiny

    model, processor = build_tiny()
    lm = model.language_model.eval()
    stop = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = torch.randint(20, 200, (4, 5), generator=torch.Generator().manual_seed(0))  # [N, L]
    embeds, attention = model.get_input_embeddings()(prompt).detach(), torch.ones(4, 5, dtype=torch.long)

    def lengths():
        out = generation.sample_completions(lm, embeds, attention, max_new_tokens=6, stop_token_ids=[stop],
                                            generator=torch.Generator().manual_seed(1))
        return out.completion_mask.sum(-1).tolist(), out.ids

    free, _ = lengths()
    assert free == [6] * 4  # random weights never pick the stop token
    clock, original = PhaseClock(torch.device("cpu")), generation._next_token
    forced = ForcedAnswers(clock, stop, caption_lengths=(2, 3))
    with forced.installed():
        with clock("rollout/mask_to_caption_policy_sampling"):
            first, ids = lengths()
            second, _ = lengths()
        unforced, _ = lengths()
    assert all(n in (2, 3) for n in first + second) and set(first + second) == {2, 3}
    assert all(ids[row, n - 1] == stop for row, n in enumerate(first))
    assert unforced == free and generation._next_token is original and lengths()[0] == free


def test_the_gpu_step_defaults_are_the_released_size_configs_settings():
    """On CUDA a flag left out takes the released-size configs' step settings (what a GPU user trains with); on CPU
    GRPOConfig's defaults; 0 turns a length bucket off."""
    from mmengine.config import Config

    from projects.llava_sam2.rl_train.benchmarks.rl_step import (
        PRESET_STEP_DEFAULTS, STEP_DEFAULTS, fill_step_defaults, parse_args)
    from projects.llava_sam2.rl_train.grpo.config import GRPOConfig

    root = Path(__file__).resolve().parents[1] / "projects/llava_sam2/configs/rl"
    for preset in ("1b", "4b", "8b"):
        name = f"sa2va_{preset}_grpo_cycle.py"
        released = Config.fromfile(str(root / name)).train_cfg["algorithm"]["config"]
        assert {k: released.get(k) for k in STEP_DEFAULTS["cuda"]} == STEP_DEFAULTS["cuda"], name
        own = PRESET_STEP_DEFAULTS.get(preset, {})
        assert released.get("uncheckpointed_layers") == own.get("uncheckpointed_layers", 0), name
        args = fill_step_defaults(parse_args(["--preset", preset]), "cuda")
        assert args.uncheckpointed_layers == released.get("uncheckpointed_layers"), name
    defaults = GRPOConfig()
    assert STEP_DEFAULTS["cpu"] == {k: getattr(defaults, k) for k in STEP_DEFAULTS["cpu"]}
    args = fill_step_defaults(parse_args(["--completion-length-multiple", "0", "--decode-backend", "fast"]), "cuda")
    assert (args.decode_backend, args.logprob_head, args.prompt_length_multiple, args.completion_length_multiple) == \
        ("fast", "fused", 64, None)


def test_a_pending_partner_update_is_timed_where_the_rollout_waits_for_it(monkeypatch):
    """With host storage the EMA lerp runs after ``ema_partner`` returns: the bench shows the part of it that the next
    rollout still waits for as the nested key ``partner_wait/<loop>`` (also inside ``rollout``, not added twice)."""
    import time

    import torch
    from torch import nn

    from projects.llava_sam2.rl_train.benchmarks.step_clock import PhaseClock, step_seconds
    from projects.llava_sam2.rl_train.grpo import weights as weights_module

    real, clock = weights_module.foreach_lerp_, PhaseClock(torch.device("cpu"))
    seen_waiting = []

    def lerp_finishing_only_once_waited_for(tensors, ends, weight):
        deadline = time.monotonic() + 5.0  # bounded: a wait that is never timed fails below instead of hanging
        while "partner_wait/mask_to_caption" not in clock.open_phases and time.monotonic() < deadline:
            time.sleep(0.005)
        seen_waiting.append("partner_wait/mask_to_caption" in clock.open_phases)
        real(tensors, ends, weight)

    monkeypatch.setattr(weights_module, "foreach_lerp_", lerp_finishing_only_once_waited_for)
    model = nn.Linear(4, 3)
    weights = weights_module.WeightSets.from_model(model, storage_device="cpu")
    weights.wait_for_update = bench.timed_partner_wait(clock, weights)
    with clock("ema_partner"):
        weights.update_partner(model)
    clock.loop = "mask_to_caption"
    with clock("rollout"):
        with weights.partner(model):
            pass
        with weights.partner(model):  # nothing pending any more: no second wait
            pass
    seconds = clock.take()
    assert seen_waiting == [True]  # the lerp ran on while ema_partner had returned, and ended inside the timed wait
    assert set(seconds) == {"ema_partner", "rollout", "partner_wait/mask_to_caption"}
    assert 0 < seconds["partner_wait/mask_to_caption"] <= seconds["rollout"]
    assert step_seconds(seconds) == seconds["ema_partner"] + seconds["rollout"]
