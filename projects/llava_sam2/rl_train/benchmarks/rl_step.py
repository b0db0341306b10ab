"""Time one dual-loop GRPO step (CycleGRPO) of a Sa2VA preset with random weights, phase by phase, next to baselines.

    sa2va-rl bench rl-step --preset 4b --batch 8 --num-generations 8 --max-new-tokens 128 --json out.json
    sa2va-rl bench rl-step --preset tiny --batch 2 --num-generations 2 --max-new-tokens 8 \\
        --naive-samples 1 --profile prof.json                                       # CPU check, < 1 min

Builds the preset directly on the device (bf16 on CUDA, fp32 on CPU; no CPU init of a 4B model), applies LoRA
(r=128, alpha=256) with the SFT trainable set (LoRA, mlp1, SAM2 mask decoder, text_hidden_fcs), LLM gradient
checkpointing on CUDA, the fp32 EMA partner and the reference snapshot (``WeightSets``, on the GPU or in pinned host
memory: ``--storage``), and times ``--iters`` iterations (after ``--warmup``) of: encode → rollout (loop 1 and
loop 2, each with its reference and partner passes) → rewards → advantages → log-probs with grad + backward →
optimizer step → EMA partner update, on a shapes-world batch of ``--image-size`` images (896 px → 2×2 tiles +
thumbnail = 1,280 image tokens per prompt on the real presets). As ``GRPOLoop`` under the GPU configs'
``AmpOptimWrapper(dtype='bfloat16')``, the rollout and the loss forward run under bf16 autocast with peft's fp32
adapters computing in bf16 (``--amp-dtype``; ``none`` keeps peft's adapter GEMMs in fp32).

Then, in the same process on the same batch (``--baselines``):

* ``generate`` (b): the same step with transformers' ``generate()`` (eager, batched over the N = B·G rows) as the
  decoder of every policy and partner pass; encoders once per image, weight-set partner.
* ``naive`` (a): the seeds' plan, rollout by rollout (``benchmarks/rl_baselines.py`` ``NaiveStep``): per-rollout
  ``generate(output_scores=True)``, encoders re-run per rollout and model, a ``copy.deepcopy`` EMA model updated
  tensor by tensor, batch-1 forward/backward. Only ``--naive-samples`` K rollouts per loop are run; the per-rollout
  phases are EXTRAPOLATED × N / K (``extrapolated_from_rollouts`` in the output).

Reported per variant (``--json``): seconds per phase (``torch.cuda.synchronize`` at every boundary; the rollout split
into policy sampling, reference scoring and partner passes; with ``--storage cpu`` the EMA lerp runs in the background
after ``ema_partner`` and what a swap still waits for is ``partner_wait/<loop>``), generated tokens/s (policy captions
alone and all rollout tokens), rollouts/s (samples/s) for the whole step, peak memory (``max_memory_allocated`` since
that variant started), and for ours the partner + reference + swap-buffer bytes in total and on the GPU, as fractions
of the model's parameter bytes. ``--profile PATH`` profiles one more step of ours with ``torch.profiler`` and writes
the top operators / kernels by self device time (CPU time on CPU) and the per-phase ranges to PATH.
A baseline's peak also counts what stays allocated from ours (model, optimizer state, weight sets); the naive
one adds its deep-copied EMA model.

Host preprocessing: as in a training run with DataLoader workers, the image batch is built by the collate
(``data.collate.PreprocessingCollate``: InternVL tiles, SAM2 input, gt masks and region cells, made once per sample
before the timed iterations; ``loader_batch_s`` says how long that took), so the step's ``encode`` phase is the
host→device copies and the frozen encoders. ``--preprocess-in step`` leaves the preprocessing to ``encode`` (every
iteration pays it, as a run without workers does); ``sa2va-rl bench loader --preprocess PRESET`` times the loader side.

Cold and warm: every variant also reports each timed iteration's step seconds (``iteration_step_s``), and with
``--warmup 0`` ``cold_step_s`` (the first iteration of the process, which pays every first-shape cost: attention
plans, allocator growth, graph captures) and ``warm_step_s`` (the mean of the later ones); after a warm-up
``cold_step_s`` is None and ``warm_step_s`` is the mean of all timed iterations. ``--prompt-length-multiple`` and
``--completion-length-multiple`` turn on the length buckets of the released-size configs (GRPOConfig), so that
a new batch meets shapes an earlier one already paid for (docs/speed.md).

Random-weight caveats: the LM never emits a stop token (every caption runs to ``--max-new-tokens``: the worst case)
and the partner practically never emits ``[SEG]`` in loop 1 (its SAM2 decode is skipped; ``partner_no_seg`` says how
often), which flatters the step. ``--force-seg`` forces the partner's loop-1 answers to ``Sure, [SEG].`` + stop, so
every rollout runs the ``[SEG]`` path (mask from SAM2, IoU), and ``--caption-lengths LO,HI`` stops every caption
(policy and partner) at a length drawn uniformly from [LO, HI] (``step_clock.ForcedAnswers``; our decoder and
``generate`` alike). The project's tiny tokenizer stands in for the real one: sampled ids are folded into its 1,151
ids before decoding (``id % len(tokenizer)``), so captions have realistic lengths instead of decoding to nothing.
Caption rewards: a token-overlap F1 stub (``--caption-reward stub``, default) or the configured METEOR + judge.

``--video`` times the video step instead (both loops on clips, grpo/cycle.py): B shapes-world clips
(``ShapesVideoWorld``) of ``--sam-frames`` frames at ``--image-size``, the language model on the first
``--mllm-frames`` of each (one tile each), loop 1 rewarded by J&F of the partner's propagated masklet (``video_jf``);
the ``naive`` baseline and the ``tiles`` sweep key are image-only.

The Qwen-VL family's presets (``qwen25vl_3b``, ``qwen25vl_7b``, ``qwen3vl_4b``; ``tiny_qwen25vl`` / ``tiny_qwen3vl`` on
CPU) build ``Sa2VAQwenModel`` the same way (``build_qwen_vl``: LoRA on the text decoder, its processor with the
released image budget: 896 px → 1,024 image tokens on Qwen2.5-VL, 784 on Qwen3-VL). ``--loops`` picks the loops a step
runs; a part of the step that refuses the model stops the bench with the part named (``explain_refusals``). On this
family ``--mask-policy region``, the baselines (their decoders take no M-RoPE positions; ``--sweep backend=reference``
times the family's ``generate``), ``--video`` and the ``tiles`` sweep key are refused with the reason;
``--force-seg`` / ``--caption-lengths`` reach its decoders, ``generate`` included.

``--sweep 'G=4 G=16 T=64 tiles=13 G=16,T=64'`` then runs ours at each point (keys G, T, B, tiles ∈ {1, 5, 10, 13},
backend = a decode backend, amp = an ``--amp-dtype``, logprob = a ``--logprob-head``, ema = sync | async, loss =
compiled | eager: ``--compile-loss-layers`` on or off, keep = an ``--uncheckpointed-layers`` count) on the same model,
``--sweep-warmup`` + ``--sweep-iters`` iterations each; a point that runs out of memory is recorded as such and the
sweep goes on. ``--logprob-head`` applies to ours and to the ``generate`` baseline alike (only the decoder differs).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from functools import partial

import numpy as np
import torch
from peft.helpers import disable_input_dtype_casting
from PIL import Image
from transformers import LogitsProcessorList

from projects.llava_sam2.rl_train.data.collate import PreprocessingCollate
from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.data.shapes_video import ShapesVideoWorld
from projects.llava_sam2.rl_train.grpo import cycle
from projects.llava_sam2.rl_train.grpo.config import GRPOConfig
from projects.llava_sam2.rl_train.grpo.mask_policy import MASK_POLICIES
from projects.llava_sam2.rl_train.grpo.trainer import CycleGRPO
from projects.llava_sam2.rl_train.grpo.weights import WeightSets
from projects.llava_sam2.rl_train.model.checkpoints.dtypes import as_torch_dtype
from projects.llava_sam2.rl_train.model.decoding.fast_generation import DECODE_BACKENDS
from projects.llava_sam2.rl_train.model.decoding.generation import LOGPROB_HEADS
from projects.llava_sam2.rl_train.model.network.lora import adapter_compute_dtype, apply_lora, configure_trainable
from projects.llava_sam2.rl_train.model.network.presets import PRESETS, QWEN_VL_PRESETS, build_preset
from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

from projects.llava_sam2.rl_train.model.decoding.text_decoding import TextDecoding
from projects.llava_sam2.rl_train.model.pipeline.shared import SEG_ANSWER, is_qwen_vl_model, seg_answer_ids

from projects.llava_sam2.rl_train.benchmarks.rl_baselines import (
    HF_GENERATE, HF_GENERATE_SCORES, NaiveStep, StubCaptionReward, folded_texts, hf_generate_completions,
    hf_generate_with_scores)
from projects.llava_sam2.rl_train.benchmarks.step_clock import (
    ForcedAnswers, PhaseClock, peak_gib, profile_iteration, reset_peak, step_seconds, summarize, token_counts)

PROG = "sa2va-rl bench rl-step"


# the tiny Qwen-VL presets' image budget (LLM image tokens 4..16): the released one (512..2048 tokens) would turn a
# CPU smoke run's 224 px image into 500+ tokens
TINY_QWEN_VL_PIXELS = dict(min_pixels=4 * 28 * 28, max_pixels=16 * 28 * 28)


def build(preset: str, device: torch.device, dtype: torch.dtype, lora_r: int, grad_ckpt: bool):
    if preset in QWEN_VL_PRESETS:
        return build_qwen_vl(preset, device, dtype, lora_r, grad_ckpt)
    tokenizer = load_tiny_tokenizer()
    config = build_preset(preset, vocab_size=len(tokenizer) if preset == "tiny" else None)
    with device:
        model = Sa2VAModel(config).to(dtype)
    model.bind_tokenizer(tokenizer)
    model.language_model = apply_lora(model.language_model, r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.05)
    if grad_ckpt:
        model.language_model.gradient_checkpointing_enable()
    configure_trainable(model)
    processor = Sa2VAProcessor.from_config(tokenizer, config, empty_region="dilate_to_one_cell")
    return model, processor


def build_qwen_vl(preset: str, device: torch.device, dtype: torch.dtype, lora_r: int, grad_ckpt: bool):
    """A Qwen-VL family preset (``Sa2VAQwenModel``) as the SFT configs train it: LoRA on every text-decoder linear
    (r, alpha = 2r), the trainable set (LoRA, SAM2 mask decoder, ``text_hidden_fcs``; the vision tower and its merger
    frozen), non-reentrant activation checkpointing of the text decoder. The tiny Qwen-VL tokenizer stands in for the
    released one (the vision-marker ids in the config are set to its ids, which transformers finds images by), and
    the processor keeps the released image budget except on the tiny presets."""
    from projects.llava_sam2.rl_train.model.network.qwen_vl import Sa2VAQwenModel
    from projects.llava_sam2.rl_train.model.text.qwen_processor import (
        Sa2VAQwenProcessor, tiny_qwen_vl_tokenizer, vision_token_fields)

    tokenizer = tiny_qwen_vl_tokenizer()
    config = build_preset(preset)
    config.data.update(vision_token_fields(tokenizer))
    with device:
        model = Sa2VAQwenModel(config).to(dtype)
    model.bind_tokenizer(tokenizer)
    model.apply_lora(r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.05)
    if grad_ckpt:
        model.hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    configure_trainable(model)
    pixels = TINY_QWEN_VL_PIXELS if preset.startswith("tiny") else {}
    return model, Sa2VAQwenProcessor.from_config(tokenizer, config, **pixels)


@contextmanager
def instrumented(clock: PhaseClock, weights: WeightSets, texts, forced: ForcedAnswers | None = None,
                 model=None):
    """Inside the block: the rollout's parts are timed (policy caption sampling, partner passes, reference passes),
    captions decode with ``texts``, the baselines' decoders are registered and ``forced`` scripts the decoders'
    choices; all undone on exit (the bench may run in-process, e.g. from a test)."""
    names = ("sample_text", "partner_segment", "partner_segment_video", "partner_describe", "completion_texts",
             "qwen_vl_sample_text")
    saved = {name: getattr(cycle, name) for name in names if hasattr(cycle, name)}
    added = [name for name in (HF_GENERATE, HF_GENERATE_SCORES) if name not in DECODE_BACKENDS]
    cycle.sample_text = clock.wrap(cycle.sample_text, "rollout/mask_to_caption_policy_sampling")
    if hasattr(cycle, "qwen_vl_sample_text"):  # the Qwen-VL family's loop-1 sampling
        cycle.qwen_vl_sample_text = clock.wrap(cycle.qwen_vl_sample_text, "rollout/mask_to_caption_policy_sampling")
    cycle.partner_segment = clock.wrap(cycle.partner_segment, "rollout/mask_to_caption_partner_segment")
    cycle.partner_segment_video = clock.wrap(cycle.partner_segment_video, "rollout/mask_to_caption_partner_segment")
    cycle.partner_describe = clock.wrap(cycle.partner_describe, "rollout/caption_to_mask_partner_describe")
    cycle.completion_texts = texts
    weights.reference = clock.wrap_context(weights.reference, "reference_scoring")
    weights.wait_for_update = timed_partner_wait(clock, weights)
    extra = {} if forced is None else {"logits_processor": LogitsProcessorList([forced.processor()])}
    DECODE_BACKENDS.update({HF_GENERATE: partial(hf_generate_completions, **extra),
                            HF_GENERATE_SCORES: partial(hf_generate_with_scores, **extra)})
    try:
        with ExitStack() as stack:
            if forced is not None:
                stack.enter_context(forced.installed())
                if model is not None and is_qwen_vl_model(model):  # this family's passes decode with generate
                    stack.enter_context(forced.installed_in_generate(model.model))
            yield
    finally:
        for name, fn in saved.items():
            setattr(cycle, name, fn)
        for name in added:
            del DECODE_BACKENDS[name]
        del weights.reference
        del weights.wait_for_update


def timed_partner_wait(clock: PhaseClock, weights: WeightSets):
    """``weights.wait_for_update`` timed where it blocks: a background EMA partner update still running when its
    values are next needed is step time, reported as ``partner_wait/<loop>`` inside the rollout (the loop whose
    partner or reference swap waited) and ``partner_wait/<phase>`` elsewhere. The key is nested: its seconds are
    also in the enclosing phase (no double count in the step, the loop's parts or ``policy_rest``); no phase, and
    no clock sync, when nothing is pending."""
    wait = weights.wait_for_update

    def timed():
        if not weights.update_pending:
            return wait()
        outer = clock.open_phases[0] if clock.open_phases else None
        phase = "partner_wait" if outer is None else f"partner_wait/{clock.loop if outer == 'rollout' else outer}"
        with clock(phase):
            return wait()
    return timed


def run_iteration(algo, model, optimizer, params, batch, clock: PhaseClock, amp: torch.dtype | None = None) -> dict:
    """One step as ``GRPOLoop`` runs it; ``amp``: the dtype its ``AmpOptimWrapper`` autocasts to (rollout and loss
    forward under autocast, backward outside; engine/loop.py), None for no autocast."""
    with clock("encode"):
        features = algo.encode(batch)
    with clock("rollout"), adapter_compute_dtype(model, amp):
        sampled = algo.rollout(features)
    with clock("rewards"):
        scored = algo.score(sampled)
    with clock("advantages"):
        advantaged = algo.compute_advantages(scored)
    model.train()
    # as GRPOLoop: the forward under autocast, the backward outside it with peft's input upcast still off
    with clock("logprob_backward"), disable_input_dtype_casting(model, active=amp is not None):
        for minibatch in algo.minibatches(advantaged):
            with adapter_compute_dtype(model, amp):
                loss = algo.policy_loss(model, minibatch)["loss"]
            loss.backward()
    with clock("optimizer"):
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    with clock("ema_partner"):
        algo.weights.update_partner(model)
    return token_counts(advantaged.rollouts)


def run_variant(algo, model, optimizer, params, batch, clock, warmup: int, iters: int,
                amp: torch.dtype | None = None) -> dict:
    """Warm-up iterations, then ``iters`` timed ones of ``algo``; the summary of the mean iteration, plus each timed
    iteration's step seconds and the cold / warm split (:func:`cold_and_warm`)."""
    counts, totals, steps = defaultdict(float), defaultdict(float), []
    clock.take()
    for iteration in range(warmup + iters):
        clock.active = iteration >= warmup
        if iteration == warmup:
            reset_peak(clock.device)
        for key, value in run_iteration(algo, model, optimizer, params, batch, clock, amp).items():
            if clock.active:
                counts[key] += value
        if clock.active:
            seconds = clock.take()
            steps.append(step_seconds(seconds))
            for key, value in seconds.items():
                totals[key] += value
    seconds = {k: v / iters for k, v in totals.items()}
    N = len(batch) * algo.config.num_generations * len(algo.loops)
    summary = summarize(seconds, {k: v / iters for k, v in counts.items()}, N, peak_gib(clock.device))
    return {**summary, "iteration_step_s": steps, **cold_and_warm(steps, warmup, N)}


def cold_and_warm(steps: list[float], warmup: int, num_rollouts: int) -> dict:
    """Cold: the first timed iteration when nothing ran before it (``warmup`` 0), so it pays every first-shape cost
    (attention plans, allocator growth, graph captures, lazy inits); None after a warm-up. Warm: the mean of the
    timed iterations after the cold one (all of them after a warm-up); None when there are none."""
    cold = steps[0] if warmup == 0 and steps else None
    later = steps[1:] if warmup == 0 else steps
    warm = sum(later) / len(later) if later else None
    return {"cold_step_s": cold, "warm_step_s": warm,
            "cold_rollouts_per_s": None if cold is None else num_rollouts / cold,
            "warm_rollouts_per_s": None if warm is None else num_rollouts / warm}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS) + sorted(QWEN_VL_PRESETS),
                        help="a size preset; the Qwen-VL family's: " + ", ".join(sorted(QWEN_VL_PRESETS)))
    parser.add_argument("--loops", default="both", choices=["both", *LOOP_NAMES],
                        help="the cycle loops a step runs (both: the dual-loop step)")
    parser.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on CPU by default")
    parser.add_argument("--batch", type=int, default=8, help="B prompts per iteration")
    parser.add_argument("--num-generations", type=int, default=8, help="G rollouts per prompt and loop")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="caption tokens (policy and partner)")
    parser.add_argument("--image-size", type=int, default=None, help="square image side (224 tiny, 896 otherwise)")
    parser.add_argument("--lora-r", type=int, default=128)
    parser.add_argument("--mask-policy", default="bernoulli", choices=sorted(MASK_POLICIES),
                        help="loop-2 action (the timings in docs/benchmarks.md were taken with bernoulli)")
    parser.add_argument("--beta", type=float, default=0.04, help="KL weight; 0 drops the reference pass")
    parser.add_argument("--generation-chunk-size", type=int, default=None)
    parser.add_argument("--minibatch-size", type=int, default=None)
    parser.add_argument("--decode-backend", default=None, choices=sorted(set(DECODE_BACKENDS) - {"reference"}),
                        help="ours: the decoder of every rollout pass (GRPOConfig.decode_backend); default: "
                             "STEP_DEFAULTS of the device")
    parser.add_argument("--logprob-head", default=None, choices=sorted(LOGPROB_HEADS),
                        help="ours: how the LM head scores tokens in every log-prob pass (GRPOConfig.logprob_head); "
                             "default: STEP_DEFAULTS of the device")
    parser.add_argument("--compile-loss-layers", action=argparse.BooleanOptionalAction, default=None,
                        help="ours: each decoder layer of the grouped log-prob passes through torch.compile "
                             "(GRPOConfig.compile_loss_layers); default: STEP_DEFAULTS of the device; sweep key "
                             "loss=compiled|eager")
    parser.add_argument("--joint-loop-scoring", action=argparse.BooleanOptionalAction, default=True,
                        help="ours: both loops' log-prob passes over one image prefix per sample "
                             "(GRPOConfig.joint_loop_scoring); sweep key joint=on|off")
    parser.add_argument("--uncheckpointed-layers", type=int, default=None,
                        help="ours: the last k decoder layers of the grouped log-prob passes keep their activations "
                             "instead of being checkpointed (GRPOConfig.uncheckpointed_layers); default: "
                             "PRESET_STEP_DEFAULTS on CUDA, else 0; sweep key keep=k")
    parser.add_argument("--prompt-length-multiple", type=int, default=None,
                        help="ours: left-pad every prompt batch to a multiple of this (GRPOConfig."
                             "prompt_length_multiple); 0: no buckets; default: STEP_DEFAULTS of the device")
    parser.add_argument("--completion-length-multiple", type=int, default=None,
                        help="ours: right-pad sampled completions to a multiple of this (GRPOConfig."
                             "completion_length_multiple); 0: no buckets; default: STEP_DEFAULTS of the device")
    parser.add_argument("--storage", default="cuda", choices=["cuda", "cpu"],
                        help="where partner/reference/swap values live: beside the parameters, or pinned host memory")
    parser.add_argument("--caption-reward", default="stub", choices=["stub", "default"])
    parser.add_argument("--grad-ckpt", default=None, choices=["on", "off"], help="default: on for CUDA")
    parser.add_argument("--amp-dtype", default=None, choices=["bfloat16", "float16", "none"],
                        help="autocast of rollout and loss forward, as the configs' AmpOptimWrapper (engine/loop.py): "
                             "default bfloat16 on CUDA, none on CPU; none = LoRA GEMMs in fp32")
    parser.add_argument("--force-seg", action="store_true",
                        help="the partner's loop-1 answers are forced to 'Sure, [SEG].' + stop (the [SEG] path runs)")
    parser.add_argument("--caption-lengths", default=None, metavar="LO,HI",
                        help="every caption stops at a length drawn uniformly from [LO, HI] (default: never)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--preprocess-in", choices=("loader", "step"), default="loader",
                        help="where an image batch's host preprocessing runs: 'loader' builds the batch with "
                             "PreprocessingCollate as a training run's DataLoader workers do (not timed in the "
                             "step; loader_batch_s), 'step' leaves it to the step's encode")
    parser.add_argument("--video", action="store_true", help="time the video step (clips; module docstring)")
    parser.add_argument("--mllm-frames", type=int, default=5, help="--video: frames per clip the LM sees (1 tile each)")
    parser.add_argument("--sam-frames", type=int, default=16, help="--video: frames per clip (SAM2 sees every one)")
    parser.add_argument("--baselines", default=None,
                        help="comma list of generate, naive ('' for none); default generate,naive (--video: generate)")
    parser.add_argument("--baseline-warmup", type=int, default=1, help="warm-up iterations of the generate baseline")
    parser.add_argument("--baseline-iters", type=int, default=1, help="timed iterations of the generate baseline")
    parser.add_argument("--naive-samples", type=int, default=2, help="K rollouts per loop run by the naive baseline")
    parser.add_argument("--sweep", default="", help="points after the main run: 'G=4 G=16 T=64 tiles=13 G=16,T=64'")
    parser.add_argument("--sweep-warmup", type=int, default=1)
    parser.add_argument("--sweep-iters", type=int, default=1)
    parser.add_argument("--time-limit-s", type=float, default=None,
                        help="start no sweep point once this many seconds have passed since the bench started")
    parser.add_argument("--profile", default=None, help="write a torch.profiler table of one step of ours here")
    parser.add_argument("--profile-top", type=int, default=40)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    qwen_vl = args.preset in QWEN_VL_PRESETS
    if args.baselines is None:
        args.baselines = "" if qwen_vl else "generate" if args.video else "generate,naive"
    if qwen_vl:
        refuse_for_qwen_vl(parser, args)
    unknown = set(filter(None, args.baselines.split(","))) - {"generate", "naive"}
    if unknown:
        parser.error(f"--baselines: unknown {sorted(unknown)}; use a comma list of generate, naive")
    if args.video and "naive" in args.baselines.split(","):
        parser.error("--baselines naive is image-only (its per-rollout plan has no video path); drop it with --video")
    if args.video and not 1 <= args.mllm_frames <= args.sam_frames:
        parser.error(f"--video: need 1 <= --mllm-frames ({args.mllm_frames}) <= --sam-frames ({args.sam_frames})")
    if args.caption_lengths is not None:
        lo, hi = (int(x) for x in args.caption_lengths.split(","))
        if not 1 <= lo <= hi:
            parser.error(f"--caption-lengths {args.caption_lengths}: need 1 <= LO <= HI")
        args.caption_lengths = (lo, hi)
    if args.video and "tiles=" in args.sweep:
        parser.error("--sweep: tiles is image-only; a video frame is one tile")
    try:
        texts = args.sweep.split()
        # a point repeated (A/B/A/B, to see order effects) gets its occurrence number, so no result overwrites another
        args.sweep = [(text if texts[:i].count(text) == 0 else f"{text} #{texts[:i].count(text) + 1}",
                       sweep_point(text)) for i, text in enumerate(texts)]
    except ValueError as err:
        parser.error(str(err))
    return args


LOOP_NAMES = ("mask_to_caption", "caption_to_mask")


def refuse_for_qwen_vl(parser, args) -> None:
    """The settings the Qwen-VL family cannot take, each with why and what to use instead."""
    if args.mask_policy == "region":
        parser.error("--mask-policy region samples the InternVL family's region-token cells, which the Qwen-VL family "
                     "has none of (no visual-prompt input): use --mask-policy bernoulli")
    baselines = set(filter(None, args.baselines.split(",")))
    if "generate" in baselines:
        parser.error("--baselines generate: the baseline's generate decodes prompt embeddings with 1-D positions, and "
                     "a Qwen-VL prompt needs its M-RoPE positions (and Qwen3-VL's deepstack); run with --baselines '' "
                     "and compare with the family's reference decoders by --sweep backend=reference (generate for "
                     "the partner's answers, the reference decoder for loop 1's captions)")
    if "naive" in baselines:
        parser.error("--baselines naive: its per-rollout plan builds InternVL prompts (tiles, region tokens); it has "
                     "no Qwen-VL path: run with --baselines ''")
    if args.video:
        parser.error("--video: the video step is built for the InternVL family only")
    if "tiles=" in args.sweep:
        parser.error("--sweep tiles=: a tile count is the InternVL family's; the Qwen-VL family's image token count "
                     "follows --image-size")


# sweep keys -> argument names; tiles -> image (width, height) on the 448 px presets (1..12 tiles + thumbnail)
SWEEP_KEYS = {"G": "num_generations", "T": "max_new_tokens", "B": "batch", "backend": "decode_backend",
              "tiles": "tiles", "amp": "amp_dtype", "logprob": "logprob_head", "ema": "ema_update",
              "loss": "compile_loss_layers", "keep": "uncheckpointed_layers", "joint": "joint_loop_scoring"}
TEXT_KEYS = ("backend", "amp", "logprob", "ema", "loss", "joint")
LOSS_LAYERS = {"compiled": True, "eager": False}  # sweep loss= value -> compile_loss_layers
JOINT_SCORING = {"on": True, "off": False}  # sweep joint= value -> joint_loop_scoring
SWITCH_VALUES = {"compile_loss_layers": ("loss", LOSS_LAYERS), "joint_loop_scoring": ("joint", JOINT_SCORING)}
TILE_IMAGES = {1: (448, 448), 5: (896, 896), 10: (1344, 1344), 13: (1792, 1344)}


def sweep_point(text: str) -> dict:
    """``'G=16,T=64'`` → ``{'num_generations': 16, 'max_new_tokens': 64}``."""
    point = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key not in SWEEP_KEYS or not value:
            raise ValueError(f"--sweep: bad point item {item!r}; use KEY=VALUE with KEY in {sorted(SWEEP_KEYS)}")
        point[SWEEP_KEYS[key]] = value if key in TEXT_KEYS else int(value)
    if point.get("ema_update", "sync") not in ("sync", "async"):
        raise ValueError(f"--sweep: ema={point['ema_update']!r}; use sync or async")
    if point.get("amp_dtype", "none") not in ("bfloat16", "float16", "none"):
        raise ValueError(f"--sweep: amp={point['amp_dtype']}; use bfloat16, float16 or none")
    if point.get("logprob_head", "reference") not in LOGPROB_HEADS:
        raise ValueError(f"--sweep: logprob={point['logprob_head']}; use one of {sorted(LOGPROB_HEADS)}")
    for name, (key, values) in SWITCH_VALUES.items():  # on/off switches spelled as words
        if name in point:
            if point[name] not in values:
                raise ValueError(f"--sweep: {key}={point[name]}; use one of {sorted(values)}")
            point[name] = values[point[name]]
    if point.get("uncheckpointed_layers", 0) < 0:
        raise ValueError(f"--sweep: keep={point['uncheckpointed_layers']}; use a layer count >= 0")
    if point.get("tiles", 5) not in TILE_IMAGES:
        raise ValueError(f"--sweep: tiles={point['tiles']}; use one of {sorted(TILE_IMAGES)}")
    return point


def amp_dtype(name: str) -> torch.dtype | None:
    """``--amp-dtype`` / sweep ``amp=`` value → the autocast dtype (None for ``none``)."""
    return None if name == "none" else as_torch_dtype(name, "--amp-dtype")


def make_batch(size: int, width: int, height: int):
    """B shapes-world samples of ``width`` × ``height`` (non-square ones resized from the square world)."""
    world = ShapesWorld("train", num_samples=size, seed=0, image_size=max(width, height))
    batch = [world[i] for i in range(size)]
    if width == height:
        return batch
    return [dataclasses.replace(s, image=s.image.resize((width, height)),
                                gt_mask=np.asarray(Image.fromarray(np.asarray(s.gt_mask, dtype=np.uint8)).resize(
                                    (width, height), Image.NEAREST)).astype(bool)) for s in batch]


def make_video_batch(size: int, side: int, num_frames: int):
    """B shapes-world clips of ``num_frames`` square frames of ``side`` pixels."""
    world = ShapesVideoWorld("train", num_samples=size, seed=0, image_size=side, num_frames=num_frames)
    return [world[i] for i in range(size)]


def step_batch(args, width: int, height: int, processor=None):
    """The batch of a run: clips (``--video``, square frames) or images. With ``--preprocess-in loader`` (and a
    ``processor``) the image batch is built as a training run's DataLoader builds it, by ``PreprocessingCollate``:
    the host preprocessing (tiles, SAM2 input, masks, region cells) is then done here, not in the timed step."""
    if args.video:
        return make_video_batch(args.batch, max(width, height), args.sam_frames)
    samples = make_batch(args.batch, width, height)
    if processor is None or args.preprocess_in != "loader":
        return samples
    return PreprocessingCollate(processor)(samples)


def tiles_per_prompt(args, processor, batch) -> int:
    """LLM tiles of one prompt: the image's, or one per MLLM frame of a clip."""
    if args.video:
        return min(args.mllm_frames, len(batch[0].frames))
    return processor.preprocess_image(batch[0].image).n_tiles


def make_algo(model, processor, weights, args, decode_backend: str) -> CycleGRPO:
    config = dict(num_generations=args.num_generations, max_completion_length=args.max_new_tokens, beta=args.beta,
                  mask_policy=args.mask_policy, generation_chunk_size=args.generation_chunk_size,
                  decode_backend=decode_backend, logprob_head=args.logprob_head, video_mllm_frames=args.mllm_frames,
                  compile_loss_layers=args.compile_loss_layers, uncheckpointed_layers=args.uncheckpointed_layers,
                  joint_loop_scoring=args.joint_loop_scoring, prompt_length_multiple=args.prompt_length_multiple,
                  completion_length_multiple=args.completion_length_multiple)
    for name in LOOP_NAMES:  # a loop with weight 0 is not run
        config[f"{name}_weight"] = 1.0 if args.loops in ("both", name) else 0.0
    rewards = {"mask_to_caption": [dict(type="video_jf" if args.video else "iou")]}
    if args.caption_reward == "stub":
        rewards["caption_to_mask"] = [StubCaptionReward()]
    algo = CycleGRPO(model, processor, weights, rewards=rewards, config=config, minibatch_size=args.minibatch_size,
                     seed=0)
    explain_refusals(algo, args)
    return algo


def explain_refusals(algo, args) -> None:
    """A step part that refuses this model (``ValueError`` / ``NotImplementedError`` from the step's encode or a loop's
    rollout: a setting or a model family it does not support) stops the bench naming the part and the ``--loops``
    runs to try instead of ending in a traceback."""
    def checked(fn, where: str, instead: list[str]):
        def call(*a, **kw):
            try:
                return fn(*a, **kw)
            except (ValueError, NotImplementedError) as err:
                hint = "; time one loop alone with " + " or ".join(f"--loops {n}" for n in instead) if instead else ""
                raise SystemExit(f"{PROG}: {where} does not run on --preset {args.preset}: {err}{hint}") from err
        return call

    loops = [loop.name for loop in algo.loops]
    multi = loops if len(loops) > 1 else []
    algo.encode = checked(algo.encode, f"the step's encode (loops: {', '.join(loops)})", multi)
    for loop in algo.loops:
        loop.rollout = checked(loop.rollout, f"loop {loop.name}", [n for n in multi if n != loop.name])


def forced_answers(args, processor, model, clock) -> ForcedAnswers | None:
    if not args.force_seg and args.caption_lengths is None:
        return None
    seg = seg_answer_ids(processor.tokenizer, SEG_ANSWER, model.seg_token_id)[0].tolist() if args.force_seg else None
    stop_id = TextDecoding.from_processor(processor).stop_token_ids[0]
    return ForcedAnswers(clock, stop_id, seg_answer=seg, caption_lengths=args.caption_lengths)


# The step settings a flag left out takes: on CUDA those of the released-size configs
# (configs/rl/_base_/sa2va_grpo_cycle_dlc.py, kept equal by tests/test_bench_rl_step.py), so the bench times the step
# a GPU user trains with; on CPU GRPOConfig's defaults (the CPU configs' exact path).
STEP_DEFAULTS = {
    "cuda": dict(decode_backend="fast_fused_split_compiled", logprob_head="fused", prompt_length_multiple=64,
                 completion_length_multiple=32, compile_loss_layers=False),
    "cpu": dict(decode_backend="fast", logprob_head="reference", prompt_length_multiple=None,
                completion_length_multiple=None, compile_loss_layers=False),
}

# On CUDA, what the released config of a preset's size sets on top (configs/rl/sa2va_<preset>_grpo_cycle.py, kept
# equal by tests/test_bench_rl_step.py); a setting not named here is GRPOConfig's default.
PRESET_STEP_DEFAULTS = {"4b": dict(uncheckpointed_layers=8)}


def fill_step_defaults(args, device_type: str):
    """Flags left out (None) take ``STEP_DEFAULTS[device_type]`` (on CUDA with ``PRESET_STEP_DEFAULTS`` of the
    preset), then GRPOConfig's defaults; a length multiple of 0 means no buckets."""
    preset = PRESET_STEP_DEFAULTS.get(getattr(args, "preset", None), {}) if device_type == "cuda" else {}
    for name, value in {**STEP_DEFAULTS[device_type], **preset}.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.uncheckpointed_layers is None:
        args.uncheckpointed_layers = GRPOConfig().uncheckpointed_layers
    for name in ("prompt_length_multiple", "completion_length_multiple"):
        if getattr(args, name) == 0:
            setattr(args, name, None)
    return args


def run_benchmark(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns what ``--json`` writes."""
    args = parse_args(argv)
    started = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    fill_step_defaults(args, device.type)
    dtype = as_torch_dtype(args.dtype, "--dtype") if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    grad_ckpt = (args.grad_ckpt or ("on" if device.type == "cuda" else "off")) == "on"
    amp_name = args.amp_dtype or ("bfloat16" if device.type == "cuda" else "none")
    amp = amp_dtype(amp_name)
    torch.manual_seed(0)
    start = time.perf_counter()
    model, processor = build(args.preset, device, dtype, args.lora_r, grad_ckpt)
    weights = WeightSets.from_model(model, ema_decay=0.999, use_reference=args.beta > 0,
                                    storage_device="cpu" if args.storage == "cpu" else None)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0)
    image_size = args.image_size or (224 if args.preset.startswith("tiny") else 896)
    loader_start = time.perf_counter()
    batch = step_batch(args, image_size, image_size, processor)
    loader_s = time.perf_counter() - loader_start
    clock = PhaseClock(device)
    clock.sync()
    build_s = time.perf_counter() - start
    texts = folded_texts(processor.tokenizer, cycle.completion_texts)
    memory = weights.memory()
    result = {"preset": args.preset, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "dtype": str(dtype), "amp_dtype": amp_name, "torch": torch.__version__, "build_s": build_s,
              "params": sum(p.numel() for p in model.parameters()), "trainable_params": sum(p.numel() for p in params),
              "gradient_checkpointing": grad_ckpt, "n_tiles": tiles_per_prompt(args, processor, batch),
              "loader_batch_s": loader_s,
              "family": getattr(model, "family", "internvl"),
              "image_tokens_per_prompt": processor.image_token_count(tiles_per_prompt(args, processor, batch)),
              **{k: v for k, v in vars(args).items() if k not in ("json", "profile", "amp_dtype")},
              "model_gib": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30,
              "partner_reference_swap_gib": memory.total_bytes / 2**30,
              "partner_reference_device_gib": memory.device_bytes / 2**30,
              "partner_reference_fraction_of_model": memory.fraction_of(model),
              "partner_reference_device_fraction_of_model": memory.device_fraction_of(model)}
    result.update(baselines={}, sweep={})

    def save() -> None:  # after every stage: a run cut short by a time limit keeps what it measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)

    forced = forced_answers(args, processor, model, clock)
    with instrumented(clock, weights, texts, forced, model):
        algo = make_algo(model, processor, weights, args, args.decode_backend)
        clock.wrap_algorithm(algo)
        result.update(run_variant(algo, model, optimizer, params, batch, clock, args.warmup, args.iters, amp))
        save()
        run_baselines(args, algo, model, processor, weights, optimizer, params, batch, clock, texts,
                      result["baselines"], save, amp)
        if args.profile:
            def profiled() -> set[str]:
                clock.take()
                run_iteration(algo, model, optimizer, params, batch, clock, amp)
                return set(clock.take())
            profile_iteration(args.profile, args.profile_top, profiled)
        deadline = None if args.time_limit_s is None else started + args.time_limit_s
        run_sweep(args, model, processor, weights, optimizer, params, clock, result["sweep"], save, deadline, amp,
                  forced)
    print(json.dumps(result, indent=2))
    print_table(result)
    return result


def run_baselines(args, algo, model, processor, weights, optimizer, params, batch, clock, texts, out: dict,
                  save, amp: torch.dtype | None = None) -> None:
    """The ``--baselines`` after ours, on the same model, batch and weight sets, into ``out``."""
    names = list(filter(None, args.baselines.split(",")))
    if "generate" in names:
        generate = make_algo(model, processor, weights, args, HF_GENERATE)
        clock.wrap_algorithm(generate)
        out["generate"] = run_variant(generate, model, optimizer, params, batch, clock, args.baseline_warmup,
                                      args.baseline_iters, amp)
        save()
    if "naive" in names:
        clock.active = True
        naive = NaiveStep(algo, optimizer, params, clock, texts)
        reset_peak(clock.device)
        run = naive.run(batch, args.naive_samples)
        N = len(batch) * args.num_generations * 2
        out["naive"] = {**summarize(run["seconds"], run["tokens"], N, peak_gib(clock.device)),
                        "extrapolated_from_rollouts": run["rollouts_measured"],
                        "seconds_measured": run["seconds_measured"]}
        del naive
        save()


def run_sweep(args, model, processor, weights, optimizer, params, clock, out: dict, save, deadline,
              amp: torch.dtype | None = None, forced: ForcedAnswers | None = None) -> None:
    """Ours at each ``--sweep`` point (same model and weight sets) into ``out``; an out-of-memory point is recorded,
    not fatal; no point starts after ``deadline`` (``time.perf_counter()`` value, None: no limit). A point with its
    own T scales the forced caption lengths with it (``--caption-lengths 32,128`` at T = 256: 64-256), so T measures
    longer captions, not only a higher cap."""
    lengths = forced.caption_lengths if forced is not None else None
    for label, point in args.sweep:
        if deadline is not None and time.perf_counter() > deadline:
            out[label] = {"error": "skipped: --time-limit-s reached"}
            continue
        settings = argparse.Namespace(**{**vars(args), **point})
        width, height = TILE_IMAGES[point["tiles"]] if "tiles" in point else (args.image_size or 896,) * 2
        batch = step_batch(settings, width, height, processor)
        if lengths is not None:
            scale = settings.max_new_tokens / args.max_new_tokens
            forced.caption_lengths = (max(1, round(lengths[0] * scale)), max(1, round(lengths[1] * scale)))
        background = weights.async_update
        try:
            if "ema_update" in point:  # sync: the host lerp inside update_partner; async: in the background
                weights.wait_for_update()
                weights.async_update = point["ema_update"] == "async" and weights.storage_device == "cpu"
            algo = make_algo(model, processor, weights, settings, settings.decode_backend)
            clock.wrap_algorithm(algo)
            point_amp = amp_dtype(point["amp_dtype"]) if "amp_dtype" in point else amp
            summary = run_variant(algo, model, optimizer, params, batch, clock, args.sweep_warmup, args.sweep_iters,
                                  point_amp)
            out[label] = {**summary, "batch": settings.batch, "num_generations": settings.num_generations,
                          "max_new_tokens": settings.max_new_tokens, "decode_backend": settings.decode_backend,
                          "logprob_head": settings.logprob_head,
                          "compile_loss_layers": settings.compile_loss_layers,
                          "uncheckpointed_layers": settings.uncheckpointed_layers,
                          "joint_loop_scoring": settings.joint_loop_scoring,
                          "ema_update": "async" if weights.async_update else "sync",
                          "amp_dtype": str(point_amp).removeprefix("torch.") if point_amp else "none",
                          "caption_lengths": forced.caption_lengths if forced is not None else None,
                          "n_tiles": tiles_per_prompt(settings, processor, batch)}
        except torch.cuda.OutOfMemoryError as err:
            out[label] = {"error": f"out of memory: {str(err).splitlines()[0]}", "peak_gib": peak_gib(clock.device)}
        finally:
            weights.wait_for_update()
            weights.async_update = background
            if lengths is not None:
                forced.caption_lengths = lengths
            optimizer.zero_grad(set_to_none=True)
            if clock.device.type == "cuda":
                torch.cuda.empty_cache()
        print(f"sweep {label}: {json.dumps(out[label])[:300]}", flush=True)
        save()


def print_table(result: dict) -> None:
    rows = [("ours", result)] + [(f"{name}{' (extrapolated)' if 'extrapolated_from_rollouts' in r else ''}", r)
                                 for name, r in result["baselines"].items()]
    rows += [(f"sweep {label}", r) for label, r in result.get("sweep", {}).items()]
    print(f"{'variant':<28} {'step s':>9} {'cold s':>8} {'warm s':>8} {'rollouts/s':>11} {'policy tok/s':>13} "
          f"{'rollout tok/s':>14} {'peak GiB':>9}")

    def seconds(value) -> str:
        return "-" if value is None else f"{value:.2f}"

    for name, r in rows:
        if "error" in r:
            print(f"{name:<28} {r['error'][:80]}")
            continue
        print(f"{name:<28} {r['seconds_per_iteration']:>9.2f} {seconds(r.get('cold_step_s')):>8} "
              f"{seconds(r.get('warm_step_s')):>8} {r['rollouts_per_s']:>11.2f} "
              f"{r['policy_caption_tokens_per_s']:>13.1f} {r['rollout_tokens_per_s']:>14.1f} {r['peak_gib']:>9.2f}")


def main(argv: list[str] | None = None) -> int:
    run_benchmark(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
