"""On a GPU: the grouped passes' layer loop replayed from CUDA graphs (model/decoding/layer_graphs.py) against the
eager loop, for a loss pass (bf16 autocast, fp32 LoRA, checkpointed, train mode), a no-grad scoring pass and the
reference (adapters off). Prints one JSON line per pass: the largest difference of the log-probs and of every
gradient between graphs and eager, next to the difference between two eager runs (kernels with atomics may differ
run to run), and the wall time of each way.

    python -m research.layer_graphs_gpu_check [--layers 8] [--hidden 1024] [--batch 4] [--num-generations 8]
"""
from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from projects.llava_sam2.rl_train.model.decoding.generation import decoder_and_head
from projects.llava_sam2.rl_train.model.decoding.grouped_scoring import compile_group_layers, \
    grouped_completion_logprobs
from projects.llava_sam2.rl_train.model.decoding.layer_graphs import GRAPH_ATTRIBUTE, graph_group_layers
from projects.llava_sam2.rl_train.model.network.lora import adapter_compute_dtype, apply_lora


def build(args) -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=4096, hidden_size=args.hidden, intermediate_size=args.hidden * 4,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // args.head_dim,
                         num_key_value_heads=2, max_position_embeddings=4096, attn_implementation="sdpa")
    lm = Qwen2ForCausalLM(config).to(args.device, torch.bfloat16)
    lm = apply_lora(lm, r=64, lora_alpha=128, lora_dropout=0.0)
    with torch.no_grad():
        for name, param in lm.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02)
    lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.compile:
        compile_group_layers(lm, "inductor")
    return lm


def batch(args, seed: int):
    g = torch.Generator().manual_seed(seed)
    B, G, L, T = args.batch, args.num_generations, args.prompt_len, args.completion_len
    lengths = torch.randint(L // 2, L + 1, (B,), generator=g)
    attention = (torch.arange(L)[None] >= (L - lengths)[:, None]).long()
    ids = torch.randint(1, 4096, (B, L), generator=g) * attention
    completion_ids = torch.randint(1, 4096, (B * G, T), generator=g)
    completion_mask = torch.arange(T)[None] < torch.randint(1, T + 1, (B * G,), generator=g)[:, None]
    completion_mask[0] = True
    return [t.to(args.device) for t in (ids, attention, completion_ids, completion_mask)]


def run(lm, data, G, mode: str):
    ids, attention, completion_ids, completion_mask = data
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids)
    lm.zero_grad(set_to_none=True)
    if mode == "loss":
        lm.train()
        x = embeds.detach().clone().requires_grad_(True)
        with adapter_compute_dtype(lm, torch.bfloat16):
            logp = grouped_completion_logprobs(lm, x, attention, completion_ids, completion_mask, num_generations=G,
                                               logprob_head="fused")
        weights = torch.linspace(-1.0, 1.0, logp.numel(), device=logp.device).reshape(logp.shape)
        (weights * logp).sum().backward()
        grads = {"prompt": x.grad, **{n: p.grad for n, p in lm.named_parameters() if p.requires_grad}}
        return logp.detach(), grads
    lm.eval()
    with torch.no_grad(), adapter_compute_dtype(lm, torch.bfloat16):
        if mode == "reference":
            with lm.disable_adapter():
                logp = grouped_completion_logprobs(lm, embeds, attention, completion_ids, completion_mask,
                                                   num_generations=G, logprob_head="fused")
        else:
            logp = grouped_completion_logprobs(lm, embeds, attention, completion_ids, completion_mask,
                                               num_generations=G, logprob_head="fused")
    return logp, {}


def train_steps(lm, args, steps: int) -> list[dict]:
    """``steps`` SGD steps, each: a G-row loss pass and a one-row ([SEG]-like) pass, both forwards before one
    backward, as the trainer's two loops; returns each step's loss and gradients (the parameters change in place
    between the steps, as the optimizer changes them)."""
    G = args.num_generations
    first, second = batch(args, 3), batch(args, 4)
    B = args.batch
    one = [first[0], first[1], second[2][:B, : max(1, args.completion_len // 4)],
           second[3][:B, : max(1, args.completion_len // 4)]]
    params = [p for p in lm.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=1e-3)
    lm.train()
    out = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        total = 0
        for data, g in ((first, G), (one, 1)):
            ids, attention, completion_ids, completion_mask = data
            with torch.no_grad():
                embeds = lm.get_input_embeddings()(ids)
            x = embeds.detach().clone().requires_grad_(True)
            with adapter_compute_dtype(lm, torch.bfloat16):
                logp = grouped_completion_logprobs(lm, x, attention, completion_ids, completion_mask,
                                                   num_generations=g, logprob_head="fused")
            weights = torch.linspace(-1.0, 1.0, logp.numel(), device=logp.device).reshape(logp.shape)
            total = total + (weights * logp).sum()
        total.backward()
        grads = {n: p.grad.detach().clone() for n, p in lm.named_parameters() if p.requires_grad}
        out.append({"loss": total.item(), "grads": grads})
        optimizer.step()
    return out


class NeverWarm(set):
    """``LayerGraphs._warmed`` that makes every capture run its own warm-up first (a diagnosis switch)."""

    def __contains__(self, item) -> bool:
        return False


def train_comparison(lm, args) -> dict:
    start = {n: p.detach().clone() for n, p in lm.named_parameters() if p.requires_grad}
    graph_group_layers(lm, False)
    eager = train_steps(lm, args, args.train_steps)
    with torch.no_grad():
        for n, p in lm.named_parameters():
            if p.requires_grad:
                p.copy_(start[n])
    graph_group_layers(lm, True)
    if args.warm_every_key:
        getattr(decoder_and_head(lm)[0], GRAPH_ATTRIBUTE)._warmed = NeverWarm()
    graphed = train_steps(lm, args, args.train_steps)
    rows = []
    for e, g in zip(eager, graphed):
        rows.append({"loss": [e["loss"], g["loss"]],
                     "nonfinite_grads": sum(int(not torch.isfinite(v).all()) for v in g["grads"].values()),
                     "largest_grad_diff": max((e["grads"][n] - g["grads"][n]).abs().max().item() for n in e["grads"]),
                     "largest_grad": max(v.abs().max().item() for v in e["grads"].values())})
    counts = dict(getattr(decoder_and_head(lm)[0], GRAPH_ATTRIBUTE).counts)
    return {"pass": "train", "steps": rows, "counts": counts}


def largest_differences(a, b) -> dict:
    logp = (a[0] - b[0]).abs().max().item()
    grads = max([(a[1][n].float() - b[1][n].float()).abs().max().item() for n in a[1]], default=0.0)
    zero = sum(int(not g.abs().sum().item() > 0) for g in a[1].values())
    return {"logp": logp, "grads": grads, "zero_grads": zero}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeats: int) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--completion-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--head-dim", type=int, default=128, help="64: the 1b preset's (hidden 896, 14 heads)")
    parser.add_argument("--sdpa", default=None, help="comma-separated SDPA backends to allow (e.g. efficient,math)")
    parser.add_argument("--train-steps", type=int, default=4, help="steps of the two-loop training comparison")
    parser.add_argument("--warm-every-key", action="store_true", help="a warm-up run before every capture")
    parser.add_argument("--only-train", action="store_true", help="the training comparison alone")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (no graphs on CPU)")
    parser.add_argument("--compile", action="store_true", help="compiled layers (compile_loss_layers) too")
    args = parser.parse_args()
    if args.sdpa:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        names = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
                 "cudnn": SDPBackend.CUDNN_ATTENTION}
        sdpa_kernel([names[n] for n in args.sdpa.split(",")]).__enter__()
    lm = build(args)
    if args.train_steps:
        print(json.dumps(train_comparison(lm, args)), flush=True)
    if args.only_train:
        return
    G = args.num_generations
    first, second = batch(args, 1), batch(args, 2)
    for mode in ("loss", "score", "reference"):
        graph_group_layers(lm, False)
        run(lm, first, G, mode)  # warm
        eager = [run(lm, second, G, mode) for _ in range(2)]
        eager_s = timed(lambda: run(lm, second, G, mode), args.repeats)
        graph_group_layers(lm, True)
        run(lm, first, G, mode)  # eager + record
        graphed = run(lm, second, G, mode)  # replayed with other inputs
        graphed_again = run(lm, second, G, mode)
        graphs_s = timed(lambda: run(lm, second, G, mode), args.repeats)
        counts = dict(getattr(decoder_and_head(lm)[0], GRAPH_ATTRIBUTE).counts)
        print(json.dumps({"pass": mode, "compiled": args.compile, "eager_vs_eager": largest_differences(*eager),
                          "graphs_vs_eager": largest_differences(graphed, eager[0]),
                          "graphs_vs_graphs": largest_differences(graphed, graphed_again),
                          "eager_s": round(eager_s, 4), "graphs_s": round(graphs_s, 4), "counts": counts,
                          "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None}), flush=True)


if __name__ == "__main__":
    main()
