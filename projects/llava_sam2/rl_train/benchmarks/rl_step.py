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
thumbnail = 1,280 image tokens per prompt on the real presets).

Then, in the same process on the same batch (``--baselines``):

* ``generate`` (b): the same step with transformers' ``generate()`` (eager, batched over the N = B·G rows) as the
  decoder of every policy and partner pass; encoders once per image, weight-set partner.
* ``naive`` (a): the seeds' plan, rollout by rollout (``benchmarks/rl_baselines.py`` ``NaiveStep``): per-rollout
  ``generate(output_scores=True)``, encoders re-run per rollout and model, a ``copy.deepcopy`` EMA model updated
  tensor by tensor, batch-1 forward/backward. Only ``--naive-samples`` K rollouts per loop are run; the per-rollout
  phases are EXTRAPOLATED × N / K (``extrapolated_from_rollouts`` in the output).

Reported per variant (``--json``): seconds per phase (``torch.cuda.synchronize`` at every boundary; the rollout split
into policy sampling, reference scoring and partner passes), generated tokens/s (policy captions alone and all
rollout tokens), rollouts/s (samples/s) for the whole step, peak memory (``max_memory_allocated`` since that
variant started), and for ours the partner + reference + swap-buffer bytes in total and on the GPU, as fractions of
the model's parameter bytes. ``--profile PATH`` profiles one more step of ours with ``torch.profiler`` and writes
the top operators / kernels by self device time (CPU time on CPU) and the per-phase ranges to PATH.
A baseline's peak also counts what stays allocated from ours (model, optimizer state, weight sets); the naive
one adds its deep-copied EMA model.

Random-weight caveats: the LM never emits a stop token (every caption runs to ``--max-new-tokens``: the worst case)
and the partner practically never emits ``[SEG]`` in loop 1 (its SAM2 decode is skipped; ``partner_no_seg`` says how
often). The project's tiny tokenizer stands in for the real one: sampled ids are folded into its 1,151 ids before
decoding (``id % len(tokenizer)``), so captions have realistic lengths instead of decoding to nothing. Caption
rewards: a token-overlap F1 stub (``--caption-reward stub``, default) or the configured METEOR + judge.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.grpo import cycle
from projects.llava_sam2.rl_train.grpo.trainer import CycleGRPO
from projects.llava_sam2.rl_train.grpo.weights import WeightSets
from projects.llava_sam2.rl_train.model.fast_generation import DECODE_BACKENDS
from projects.llava_sam2.rl_train.model.lora import apply_lora, configure_trainable
from projects.llava_sam2.rl_train.model.presets import build_preset
from projects.llava_sam2.rl_train.model.processor import Sa2VAProcessor
from projects.llava_sam2.rl_train.model.sa2va import Sa2VAModel
from projects.llava_sam2.rl_train.model.tokenizer import load_tiny_tokenizer

from projects.llava_sam2.rl_train.benchmarks.rl_baselines import (
    HF_GENERATE, HF_GENERATE_SCORES, NaiveStep, StubCaptionReward, folded_texts, hf_generate_completions,
    hf_generate_with_scores)

PROG = "sa2va-rl bench rl-step"


class PhaseClock:
    """Seconds per phase, synchronising the GPU at every boundary (each phase is also a profiler range)."""

    def __init__(self, device: torch.device):
        self.device, self.seconds, self.active = device, defaultdict(float), True
        self.loop = "loop"  # the loop whose rollout is running (set by ``wrap_loop``)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def take(self) -> dict[str, float]:
        """The seconds gathered so far, and a fresh start."""
        seconds, self.seconds = dict(self.seconds), defaultdict(float)
        return seconds

    @contextmanager
    def __call__(self, phase: str):
        self.sync()
        start = time.perf_counter()
        try:
            with torch.profiler.record_function(phase):
                yield
        finally:
            self.sync()
            if self.active:
                self.seconds[phase] += time.perf_counter() - start

    def wrap(self, fn, phase: str):
        def timed(*args, **kwargs):
            with self(phase):
                return fn(*args, **kwargs)
        return timed

    def wrap_context(self, cm_fn, phase: str):
        """Time the body of a context manager under ``rollout/<current loop>_<phase>``."""
        @contextmanager
        def timed(*args, **kwargs):
            with self(f"rollout/{self.loop}_{phase}"), cm_fn(*args, **kwargs):
                yield
        return timed

    def wrap_loop(self, loop) -> None:
        rollout = loop.rollout

        def timed(*args, **kwargs):
            self.loop = loop.name
            with self(f"rollout/{loop.name}_total"):
                return rollout(*args, **kwargs)
        loop.rollout = timed


def build(preset: str, device: torch.device, dtype: torch.dtype, lora_r: int, grad_ckpt: bool):
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


@contextmanager
def instrumented(clock: PhaseClock, weights: WeightSets, texts):
    """Inside the block: the rollout's parts are timed (policy caption sampling, partner passes, reference passes),
    captions decode with ``texts`` and the baselines' decoders are registered; all undone on exit (the bench may run
    in-process, e.g. from a test)."""
    names = ("sample_text", "partner_segment", "partner_describe", "completion_texts")
    saved = {name: getattr(cycle, name) for name in names}
    added = [name for name in (HF_GENERATE, HF_GENERATE_SCORES) if name not in DECODE_BACKENDS]
    cycle.sample_text = clock.wrap(cycle.sample_text, "rollout/loop1_policy_sampling")
    cycle.partner_segment = clock.wrap(cycle.partner_segment, "rollout/loop1_partner_segment")
    cycle.partner_describe = clock.wrap(cycle.partner_describe, "rollout/loop2_partner_describe")
    cycle.completion_texts = texts
    weights.reference = clock.wrap_context(weights.reference, "reference_scoring")
    DECODE_BACKENDS.update({HF_GENERATE: hf_generate_completions, HF_GENERATE_SCORES: hf_generate_with_scores})
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(cycle, name, fn)
        for name in added:
            del DECODE_BACKENDS[name]
        del weights.reference


def run_iteration(algo, model, optimizer, params, batch, clock: PhaseClock) -> dict:
    with clock("encode"):
        features = algo.encode(batch)
    with clock("rollout"):
        rollouts = algo.rollout(features)
    with clock("rewards"):
        algo.score(rollouts)
    with clock("advantages"):
        algo.compute_advantages(rollouts)
    model.train()
    with clock("logprob_backward"):
        for minibatch in algo.minibatches(rollouts):
            algo.policy_loss(model, minibatch)["loss"].backward()
    with clock("optimizer"):
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    with clock("ema_partner"):
        algo.weights.update_partner(model)
    return token_counts(rollouts)


def token_counts(rollouts) -> dict:
    """Generated tokens of one iteration: policy captions (loop 1), partner answers (loop 1), partner captions
    (loop 2), and the partner's no-[SEG] count."""
    counts = defaultdict(float)
    for rollout in rollouts:
        stats, N = rollout.reward_stats, rollout.num_rollouts
        if "partner/no_seg" in stats:
            counts["policy_caption_tokens"] += float(rollout.action_mask.sum())
            counts["partner_answer_tokens"] += stats["partner/answer_tokens"] * (N - stats["partner/empty_caption"])
            counts["partner_no_seg"] += stats["partner/no_seg"]
        if "partner/caption_tokens" in stats:
            counts["partner_caption_tokens"] += stats["partner/caption_tokens"] * (N - stats["partner/empty_mask"])
    return counts


def summarize(seconds: dict, tokens: dict, num_rollouts: int, peak_gib: float) -> dict:
    """Per-phase seconds of one iteration → throughput: ``num_rollouts`` rollouts (both loops) per step."""
    seconds = dict(sorted(seconds.items()))
    for name in ("loop1", "loop2"):
        total = seconds.get(f"rollout/{name}_total")
        if total is not None:
            parts = [v for k, v in seconds.items() if k.startswith(f"rollout/{name}_") and not k.endswith("_total")]
            seconds[f"rollout/{name}_policy_rest"] = total - sum(parts)  # prompts, old_logp, mask sampling
    step = sum(v for k, v in seconds.items() if "/" not in k)
    generated = sum(v for k, v in tokens.items() if k.endswith("_tokens"))
    return {
        "seconds_per_iteration": step, "seconds": seconds, "tokens_per_iteration": tokens,
        "rollout_tokens_per_s": generated / max(seconds.get("rollout", 0.0), 1e-9),
        "policy_caption_tokens_per_s": tokens.get("policy_caption_tokens", 0.0) / max(
            seconds.get("rollout/loop1_policy_sampling", 0.0), 1e-9),
        "rollouts_per_s": num_rollouts / step,
        "peak_gib": peak_gib,
    }


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def run_variant(algo, model, optimizer, params, batch, clock, warmup: int, iters: int) -> dict:
    """Warm-up iterations, then ``iters`` timed ones of ``algo``; the summary of the mean iteration."""
    counts = defaultdict(float)
    clock.take()
    for iteration in range(warmup + iters):
        clock.active = iteration >= warmup
        if iteration == warmup:
            reset_peak(clock.device)
        for key, value in run_iteration(algo, model, optimizer, params, batch, clock).items():
            if clock.active:
                counts[key] += value
    seconds = {k: v / iters for k, v in clock.take().items()}
    N = len(batch) * algo.config.num_generations * len(algo.loops)
    return summarize(seconds, {k: v / iters for k, v in counts.items()}, N, peak_gib(clock.device))


def profile_iteration(path: str, top: int, run) -> None:
    """One iteration of ``run()`` under torch.profiler → JSON: top ops/kernels by self device (else CPU) time, and
    the phase ranges (host wall time of each ``PhaseClock`` range, device time of the kernels inside)."""
    from torch.profiler import ProfilerActivity, profile

    on_cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        phases = run()
    events = prof.key_averages()
    key = (lambda e: e.self_device_time_total) if on_cuda else (lambda e: e.self_cpu_time_total)

    def row(e) -> dict:
        return {"name": e.key[:160], "count": e.count, "self_device_ms": e.self_device_time_total / 1e3,
                "device_ms": e.device_time_total / 1e3, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                "cpu_ms": e.cpu_time_total / 1e3}

    table = {"sorted_by": "self_device_ms" if on_cuda else "self_cpu_ms",
             "top": [row(e) for e in sorted(events, key=key, reverse=True) if e.key not in phases][:top],
             "phases": [row(e) for e in events if e.key in phases],
             "kernel_launches": sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)}
    with open(path, "w") as f:
        json.dump(table, f, indent=2)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny", choices=["tiny", "1b", "4b", "8b"])
    parser.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on CPU by default")
    parser.add_argument("--batch", type=int, default=8, help="B prompts per iteration")
    parser.add_argument("--num-generations", type=int, default=8, help="G rollouts per prompt and loop")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="caption tokens (policy and partner)")
    parser.add_argument("--image-size", type=int, default=None, help="square image side (224 tiny, 896 otherwise)")
    parser.add_argument("--lora-r", type=int, default=128)
    parser.add_argument("--mask-policy", default="bernoulli", choices=["bernoulli", "gaussian_seg", "multimask"])
    parser.add_argument("--beta", type=float, default=0.04, help="KL weight; 0 drops the reference pass")
    parser.add_argument("--generation-chunk-size", type=int, default=None)
    parser.add_argument("--minibatch-size", type=int, default=None)
    parser.add_argument("--decode-backend", default="fast", choices=["fast", "fast_compiled", "reference"],
                        help="ours: the decoder of every rollout pass (GRPOConfig.decode_backend)")
    parser.add_argument("--storage", default="cuda", choices=["cuda", "cpu"],
                        help="where partner/reference/swap values live: beside the parameters, or pinned host memory")
    parser.add_argument("--caption-reward", default="stub", choices=["stub", "default"])
    parser.add_argument("--grad-ckpt", default=None, choices=["on", "off"], help="default: on for CUDA")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--baselines", default="generate,naive", help="comma list of generate, naive ('' for none)")
    parser.add_argument("--baseline-iters", type=int, default=1, help="timed iterations of the generate baseline")
    parser.add_argument("--naive-samples", type=int, default=2, help="K rollouts per loop run by the naive baseline")
    parser.add_argument("--profile", default=None, help="write a torch.profiler table of one step of ours here")
    parser.add_argument("--profile-top", type=int, default=40)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    unknown = set(filter(None, args.baselines.split(","))) - {"generate", "naive"}
    if unknown:
        parser.error(f"--baselines: unknown {sorted(unknown)}; use a comma list of generate, naive")
    return args


def make_algo(model, processor, weights, args, decode_backend: str) -> CycleGRPO:
    config = dict(num_generations=args.num_generations, max_completion_length=args.max_new_tokens, beta=args.beta,
                  mask_policy=args.mask_policy, generation_chunk_size=args.generation_chunk_size,
                  decode_backend=decode_backend)
    rewards = {"mask_to_caption": [dict(type="iou")]}
    if args.caption_reward == "stub":
        rewards["caption_to_mask"] = [StubCaptionReward()]
    return CycleGRPO(model, processor, weights, rewards=rewards, config=config, minibatch_size=args.minibatch_size,
                     seed=0)


def run_benchmark(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns what ``--json`` writes."""
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    grad_ckpt = (args.grad_ckpt or ("on" if device.type == "cuda" else "off")) == "on"
    torch.manual_seed(0)
    start = time.perf_counter()
    model, processor = build(args.preset, device, dtype, args.lora_r, grad_ckpt)
    weights = WeightSets.from_model(model, ema_decay=0.999, use_reference=args.beta > 0,
                                    storage_device="cpu" if args.storage == "cpu" else None)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0)
    image_size = args.image_size or (224 if args.preset == "tiny" else 896)
    world = ShapesWorld("train", num_samples=args.batch, seed=0, image_size=image_size)
    batch = [world[i] for i in range(args.batch)]
    clock = PhaseClock(device)
    clock.sync()
    build_s = time.perf_counter() - start
    texts = folded_texts(processor.tokenizer, cycle.completion_texts)
    memory = weights.memory()
    result = {"preset": args.preset, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "dtype": str(dtype), "torch": torch.__version__, "build_s": build_s,
              "params": sum(p.numel() for p in model.parameters()), "trainable_params": sum(p.numel() for p in params),
              "gradient_checkpointing": grad_ckpt, "n_tiles": processor.preprocess_image(batch[0].image).n_tiles,
              **{k: v for k, v in vars(args).items() if k not in ("json", "profile")},
              "model_gib": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30,
              "partner_reference_swap_gib": memory.total_bytes / 2**30,
              "partner_reference_device_gib": memory.device_bytes / 2**30,
              "partner_reference_fraction_of_model": memory.fraction_of(model),
              "partner_reference_device_fraction_of_model": memory.device_fraction_of(model)}
    with instrumented(clock, weights, texts):
        algo = make_algo(model, processor, weights, args, args.decode_backend)
        for loop in algo.loops:
            clock.wrap_loop(loop)
        result.update(run_variant(algo, model, optimizer, params, batch, clock, args.warmup, args.iters))
        if args.profile:
            def profiled() -> set[str]:
                clock.take()
                run_iteration(algo, model, optimizer, params, batch, clock)
                return set(clock.take())
            profile_iteration(args.profile, args.profile_top, profiled)
        result["baselines"] = run_baselines(args, algo, model, processor, weights, optimizer, params, batch, clock,
                                            texts)
    print(json.dumps(result, indent=2))
    print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


def run_baselines(args, algo, model, processor, weights, optimizer, params, batch, clock, texts) -> dict:
    """The ``--baselines`` after ours, on the same model, batch and weight sets."""
    out, names = {}, list(filter(None, args.baselines.split(",")))
    if "generate" in names:
        generate = make_algo(model, processor, weights, args, HF_GENERATE)
        for loop in generate.loops:
            clock.wrap_loop(loop)
        out["generate"] = run_variant(generate, model, optimizer, params, batch, clock, 1, args.baseline_iters)
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
    return out


def print_table(result: dict) -> None:
    rows = [("ours", result)] + [(f"{name}{' (extrapolated)' if 'extrapolated_from_rollouts' in r else ''}", r)
                                 for name, r in result["baselines"].items()]
    print(f"{'variant':<24} {'step s':>9} {'rollouts/s':>11} {'policy tok/s':>13} {'rollout tok/s':>14} "
          f"{'peak GiB':>9}")
    for name, r in rows:
        print(f"{name:<24} {r['seconds_per_iteration']:>9.2f} {r['rollouts_per_s']:>11.2f} "
              f"{r['policy_caption_tokens_per_s']:>13.1f} {r['rollout_tokens_per_s']:>14.1f} {r['peak_gib']:>9.2f}")


def main(argv: list[str] | None = None) -> int:
    run_benchmark(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
