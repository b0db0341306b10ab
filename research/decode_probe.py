"""Where the bare 4b decode call's time goes, and what its parts could cost (session 16's GPU probe).

    python3 research/decode_probe.py phases   # the shipped decoder's call, phase by phase (CUDA events, no syncs)
    python3 research/decode_probe.py prefill  # the prefill body under each SDPA backend
    python3 research/decode_probe.py gemm     # the decode step's GEMM shapes: cuBLAS, cuBLASLt, Inductor max-autotune

The LM and prompts are `bench decode`'s (4b preset's LM with random weights, B=8, L=1850 left padded over 64 tokens,
G=8, 128 new tokens, the never-emitted stop id). Prints one JSON line per measurement.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from projects.llava_sam2.rl_train.benchmarks.decode import build_lm, make_prompts
from projects.llava_sam2.rl_train.model.decoding import fast_decode_step, fast_generation

B, G, L, T = 8, 8, 1850, 128
SHIPPED = dict(fuse_layers=True, pad_head=True, split_prompt_cache=True, compile_step=True)


def emit(**record):
    print(json.dumps(record), flush=True)


def decode_call(lm, embeds, attention, new_tokens=T, **switches):
    never = [lm.config.vocab_size]
    generator = torch.Generator(device=embeds.device).manual_seed(0)
    return fast_generation.fast_sample_completions(lm, embeds, attention, num_generations=G, max_new_tokens=new_tokens,
                                                   stop_token_ids=never, generator=generator,
                                                   **{**SHIPPED, **switches})


class PhaseLog:
    """Wraps module-level callables: host seconds and device span (events on the current stream) of each call."""

    def __init__(self):
        self.records = []

    def wrap(self, owner, name, label=None):
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            host = time.perf_counter()
            out = original(*args, **kwargs)
            host = time.perf_counter() - host
            end.record()
            self.records.append((label or name, host, start, end))
            return out

        setattr(owner, name, wrapped)
        return original


def phases():
    lm = build_lm("4b", torch.device("cuda"), torch.bfloat16)
    embeds, attention = make_prompts(lm, B, L, 64, seed=0)
    for _ in range(2):  # compile, then a warm call
        decode_call(lm, embeds, attention)
    torch.cuda.synchronize()
    walls = []
    for _ in range(3):
        start = time.perf_counter()
        decode_call(lm, embeds, attention)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
    wall = statistics.median(walls)
    emit(what="shipped decode call", wall_s=wall, tokens_per_s=B * G * T / wall, walls=walls)

    log = PhaseLog()
    for name in ("prefill", "build_step_plan", "split_cache", "init_state"):
        log.wrap(fast_generation, name)
    log.wrap(fast_decode_step.GraphedCall, "__call__", "graphed_step")
    log.wrap(fast_decode_step.TokenChooser, "__call__", "choose")
    call_start = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    host0 = time.perf_counter()
    call_start.record()
    decode_call(lm, embeds, attention)
    call_end = torch.cuda.Event(enable_timing=True)
    call_end.record()
    torch.cuda.synchronize()
    total_host = time.perf_counter() - host0
    steps = [r for r in log.records if r[0] == "graphed_step"]
    summary, step_index = {}, 0
    for label, host, start, end in log.records:
        if label == "graphed_step":
            label = ("graphed_step: warm-up", "graphed_step: capture + replay")[step_index] if step_index < 2 \
                else "graphed_step: replay"
            step_index += 1
        entry = summary.setdefault(label, {"calls": 0, "host_ms": 0.0, "device_span_ms": 0.0})
        entry["calls"] += 1
        entry["host_ms"] += 1e3 * host
        entry["device_span_ms"] += start.elapsed_time(end)
    emit(what="phases of one call", wall_ms=1e3 * total_host, device_ms=call_start.elapsed_time(call_end),
         phases=summary,
         first_replay_after_call_start_ms=call_start.elapsed_time(steps[1][2]),
         last_step_end_ms=call_start.elapsed_time(steps[-1][3]))


def prefill():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    lm = build_lm("4b", torch.device("cuda"), torch.bfloat16)
    parts = fast_decode_step.DecoderParts.of(lm)
    embeds, attention = make_prompts(lm, B, L, 64, seed=0)
    flat = torch.ones_like(attention)
    flops = 2 * sum(p.numel() for n, p in lm.model.layers.named_parameters()) * B * L
    cases = [("padded, default", attention, None), ("padded, efficient", attention, [SDPBackend.EFFICIENT_ATTENTION]),
             ("padded, cudnn", attention, [SDPBackend.CUDNN_ATTENTION]),
             ("unpadded, default", flat, None), ("unpadded, flash", flat, [SDPBackend.FLASH_ATTENTION]),
             ("padded, grouped layers (inductor)", attention, "grouped")]
    with torch.no_grad():
        for label, mask, backends in cases:
            try:
                def run():
                    if backends == "grouped":
                        return fast_generation.prefill(parts, embeds, mask, lm=lm, layer_backend="inductor")
                    if backends is None:
                        return fast_generation.prefill(parts, embeds, mask)
                    with sdpa_kernel(backends):
                        return fast_generation.prefill(parts, embeds, mask)
                times = _timed(run)
                emit(what="prefill body", case=label, ms=times, tflops=flops / (min(times) * 1e-3) / 1e12)
            except Exception as error:  # noqa: BLE001
                emit(what="prefill body", case=label, error=f"{type(error).__name__}: {error}"[:300])
        # the GEMMs alone: the prefill's lower bound
        x = torch.randn(B * L, 2048, device="cuda", dtype=torch.bfloat16)
        ws = {n: torch.randn(k, 2048, device="cuda", dtype=torch.bfloat16)
              for n, k in (("qkv", 2560), ("o", 2048), ("gate_up", 22016))}
        down = torch.randn(2048, 11008, device="cuda", dtype=torch.bfloat16)
        h = torch.randn(B * L, 11008, device="cuda", dtype=torch.bfloat16)

        def gemms():
            for _ in range(36):
                for w in ws.values():
                    torch.nn.functional.linear(x, w)
                torch.nn.functional.linear(h, down)
        emit(what="prefill GEMMs only (36 layers)", ms=_timed(gemms))


def _timed(fn, repeats=5):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(round(1e3 * (time.perf_counter() - start), 3))
    return out


def gemm():
    M, layers = B * G, 36
    shapes = {"qkv": (2048, 2560), "o": (2048, 2048), "gate_up": (2048, 22016), "down": (11008, 2048),
              "head": (2048, 151936)}
    x = {name: torch.randn(M, k, device="cuda", dtype=torch.bfloat16) for name, (k, _) in shapes.items()}
    for name, (k, n) in shapes.items():
        count = 1 if name == "head" else layers
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(count)]
        nbytes = count * n * k * 2

        def loop(f):
            def run():
                for w in weights:
                    f(x[name], w)
            return run

        results = {}
        for label, f in (("cublas", torch.nn.functional.linear),):
            results[label] = min(_timed(loop(f), 20))
        torch.backends.cuda.preferred_blas_library("cublaslt")
        results["cublaslt"] = min(_timed(loop(torch.nn.functional.linear), 20))
        torch.backends.cuda.preferred_blas_library("cublas")
        torch._dynamo.reset()
        tuned = torch.compile(torch.nn.functional.linear, mode="max-autotune-no-cudagraphs", dynamic=False)
        try:
            results["inductor_max_autotune"] = min(_timed(loop(tuned), 20))
        except Exception as error:  # noqa: BLE001
            results["inductor_max_autotune"] = f"{type(error).__name__}: {error}"[:200]
        emit(what="decode GEMM", shape=name, M=M, K=k, N=n, layers=count,
             ms=results, tb_per_s={k2: nbytes / (v * 1e-3) / 1e12 for k2, v in results.items()
                                   if isinstance(v, float)})


if __name__ == "__main__":
    {"phases": phases, "prefill": prefill, "gemm": gemm}[sys.argv[1]]()
