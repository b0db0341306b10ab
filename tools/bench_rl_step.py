"""Time one dual-loop GRPO step (CycleGRPO) of a Sa2VA preset with random weights, phase by phase.

    python tools/bench_rl_step.py --preset 4b --batch 8 --num-generations 8 --max-new-tokens 128 --json out.json
    python tools/bench_rl_step.py --preset tiny --batch 2 --num-generations 4 --max-new-tokens 16   # CPU check

Builds the preset directly on the device (bf16 on CUDA, fp32 on CPU; no CPU init of a 4B model), applies LoRA
(r=128, alpha=256) with the SFT trainable set (LoRA, mlp1, SAM2 mask decoder, text_hidden_fcs), LLM gradient
checkpointing on CUDA, the fp32 EMA partner and the reference snapshot (``WeightSets``), and runs ``--iters`` timed
iterations (after ``--warmup``) of: encode → rollout (loop 1 and loop 2, each with its reference and partner
passes) → rewards → advantages → log-probs with grad + backward → optimizer step → EMA partner update, on a
shapes-world batch (random images, region masks, captions).

Printed and written with ``--json``: seconds per phase (``torch.cuda.synchronize`` at every boundary; the rollout
split into policy sampling, reference scoring and partner passes by timing wrappers around those calls), generated
tokens/s (policy captions, partner answers and captions), rollouts/s, peak memory (``max_memory_allocated``) and the
partner + reference + swap-buffer bytes as a fraction of the model's parameter bytes.

Random-weight caveats: the LM never emits a stop token (every caption runs to ``--max-new-tokens``: the worst case)
and the partner practically never emits ``[SEG]`` in loop 1 (its SAM2 decode is skipped; ``partner_no_seg`` says how
often). The project's tiny tokenizer stands in for the real one: sampled ids are folded into its 1,151 ids before
decoding (``id % len(tokenizer)``), so captions have realistic lengths instead of decoding to nothing. Caption
rewards: a token-overlap F1 stub (``--caption-reward stub``, default) or the configured METEOR + judge.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.grpo import cycle
from projects.llava_sam2.rl_train.grpo.trainer import CycleGRPO
from projects.llava_sam2.rl_train.grpo.weights import WeightSets
from projects.llava_sam2.rl_train.model.lora import apply_lora, configure_trainable
from projects.llava_sam2.rl_train.model.presets import build_preset
from projects.llava_sam2.rl_train.model.processor import Sa2VAProcessor
from projects.llava_sam2.rl_train.model.sa2va import Sa2VAModel
from projects.llava_sam2.rl_train.model.tokenizer import load_tiny_tokenizer


class StubCaptionReward:
    """Token-overlap F1 of the partner's caption with the reference (a no-network stand-in for METEOR + judge)."""

    name, weight = "stub_caption", 1.0

    def __call__(self, inputs):
        values = []
        for pred, refs in zip(inputs.pred_captions, inputs.gt_captions):
            p, r = set(pred.lower().split()), set((refs[0] if refs else "").lower().split())
            common = len(p & r)
            values.append(0.0 if not common else 2 * common / (len(p) + len(r)))
        return values


class PhaseClock:
    """Seconds per phase, synchronising the GPU at every boundary; ``wrap`` times a function by name."""

    def __init__(self, device: torch.device):
        self.device, self.seconds, self.active = device, defaultdict(float), True
        self.loop = "loop"  # the loop whose rollout is running (set by ``wrap_loop``)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def __call__(self, phase: str):
        self.sync()
        start = time.perf_counter()
        try:
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


def folded_texts(tokenizer, completion_texts):
    """``completion_texts`` with ids folded into the tokenizer's range (random weights sample the full vocab)."""
    vocab = len(tokenizer)

    def texts(completions, decoding):
        folded = completions.ids % vocab
        return completion_texts(type(completions)(folded, completions.completion_mask, completions.is_truncated,
                                                  completions.token_logp), decoding)
    return texts


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


def instrument(algo: CycleGRPO, clock: PhaseClock) -> None:
    """Time the rollout's parts: policy caption sampling, partner passes, reference passes, each loop in total."""
    cycle.sample_text = clock.wrap(cycle.sample_text, "rollout/loop1_policy_sampling")
    cycle.partner_segment = clock.wrap(cycle.partner_segment, "rollout/loop1_partner_segment")
    cycle.partner_describe = clock.wrap(cycle.partner_describe, "rollout/loop2_partner_describe")
    cycle.completion_texts = folded_texts(algo.processor.tokenizer, cycle.completion_texts)
    algo.weights.reference = clock.wrap_context(algo.weights.reference, "reference_scoring")
    for loop in algo.loops:
        clock.wrap_loop(loop)


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


def summarize(clock, counts, args, model, weights, device, iters) -> dict:
    seconds = {k: v / iters for k, v in sorted(clock.seconds.items())}
    for name in ("loop1", "loop2"):
        total = seconds.get(f"rollout/{name}_total")
        if total is not None:
            parts = [v for k, v in seconds.items() if k.startswith(f"rollout/{name}_") and not k.endswith("_total")]
            seconds[f"rollout/{name}_policy_rest"] = total - sum(parts)  # prompts, old_logp, mask sampling
    step = sum(v for k, v in seconds.items() if "/" not in k)
    tokens = {k: v / iters for k, v in counts.items()}
    generated = sum(v for k, v in tokens.items() if k.endswith("_tokens"))
    num_loops = len([k for k in seconds if k.endswith("_total")])
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    memory = weights.memory()
    result = {
        "seconds_per_iteration": step, "seconds": seconds, "tokens_per_iteration": tokens,
        "rollout_tokens_per_s": generated / max(seconds["rollout"], 1e-9),
        "policy_caption_tokens_per_s": tokens.get("policy_caption_tokens", 0.0) / max(
            seconds.get("rollout/loop1_policy_sampling", 0.0), 1e-9),
        "rollouts_per_s": args.batch * args.num_generations * num_loops / step,
        "prompts_per_s": args.batch / step,
        "model_gib": model_bytes / 2**30,
        "partner_reference_swap_gib": memory.total_bytes / 2**30,
        "partner_reference_fraction_of_model": memory.fraction_of(model),
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan"),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny", choices=["tiny", "1b", "4b", "8b"])
    parser.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on CPU by default")
    parser.add_argument("--batch", type=int, default=8, help="B prompts per iteration")
    parser.add_argument("--num-generations", type=int, default=8, help="G rollouts per prompt and loop")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="caption tokens (policy and partner)")
    parser.add_argument("--image-size", type=int, default=None, help="square image side (224 tiny, 448 otherwise)")
    parser.add_argument("--lora-r", type=int, default=128)
    parser.add_argument("--mask-policy", default="bernoulli", choices=["bernoulli", "gaussian_seg", "multimask"])
    parser.add_argument("--beta", type=float, default=0.04, help="KL weight; 0 drops the reference pass")
    parser.add_argument("--generation-chunk-size", type=int, default=None)
    parser.add_argument("--minibatch-size", type=int, default=None)
    parser.add_argument("--caption-reward", default="stub", choices=["stub", "default"])
    parser.add_argument("--grad-ckpt", default=None, choices=["on", "off"], help="default: on for CUDA")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    grad_ckpt = (args.grad_ckpt or ("on" if device.type == "cuda" else "off")) == "on"
    torch.manual_seed(0)
    start = time.perf_counter()
    model, processor = build(args.preset, device, dtype, args.lora_r, grad_ckpt)
    config = dict(num_generations=args.num_generations, max_completion_length=args.max_new_tokens, beta=args.beta,
                  mask_policy=args.mask_policy, generation_chunk_size=args.generation_chunk_size)
    weights = WeightSets.from_model(model, ema_decay=0.999, use_reference=args.beta > 0)
    rewards = {"mask_to_caption": [dict(type="iou")]}
    if args.caption_reward == "stub":
        rewards["caption_to_mask"] = [StubCaptionReward()]
    algo = CycleGRPO(model, processor, weights, rewards=rewards, config=config, minibatch_size=args.minibatch_size,
                     seed=0)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0)
    image_size = args.image_size or (224 if args.preset == "tiny" else 448)
    world = ShapesWorld("train", num_samples=args.batch, seed=0, image_size=image_size)
    batch = [world[i] for i in range(args.batch)]
    clock = PhaseClock(device)
    clock.sync()
    build_s = time.perf_counter() - start
    instrument(algo, clock)
    counts = defaultdict(float)
    for iteration in range(args.warmup + args.iters):
        clock.active = iteration >= args.warmup
        if iteration == args.warmup and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for key, value in run_iteration(algo, model, optimizer, params, batch, clock).items():
            if clock.active:
                counts[key] += value
    result = {"preset": args.preset, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "dtype": str(dtype), "build_s": build_s, "params": sum(p.numel() for p in model.parameters()),
              "trainable_params": sum(p.numel() for p in params), "gradient_checkpointing": grad_ckpt,
              "n_tiles": processor.preprocess_image(batch[0].image).n_tiles, **{k: v for k, v in vars(args).items()
                                                                                if k != "json"}}
    result.update(summarize(clock, counts, args, model, weights, device, args.iters))
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
