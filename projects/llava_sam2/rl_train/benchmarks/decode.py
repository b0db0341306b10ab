"""Rollout decode throughput: HF generate vs the reference decoder vs the fast path (docs/speed.md).

    sa2va-rl bench decode --lm qwen2.5-3b --json decode.json --trace decode_trace   # one GPU
    sa2va-rl bench decode --lm 4b --json decode_4b.json                            # Sa2VA-4B's LM
    sa2va-rl bench decode --lm tiny --device cpu --batch 2 --num-generations 2 \\
        --prompt-len 24 --new-tokens 8 --repeats 1                                          # CPU smoke

A causal LM with random weights is built directly on the device in ``--dtype``; B prompts of about
``--prompt-len`` tokens (left padded: lengths spread over the last ``--length-spread`` tokens) are
embedded, and every mode decodes ``N = B·G`` rows of exactly ``--new-tokens`` tokens (the stop id is
outside the vocabulary, so rows never stop and tokens/s are comparable):

* ``hf_generate``: ``lm.generate`` (dynamic cache, eager) on the N prompt rows;
* ``reference``:   ``generation.sample_completions`` on the N prompt rows;
* ``fast_eager``:  ``fast_generation.fast_sample_completions`` on the B prompts with G samples each,
  decode step run eagerly (CUDA only: shows what the graph buys);
* ``fast``:        the same with the decode step replayed from a CUDA graph (eager on CPU);
* ``fast_compiled``: the same with the step compiled by ``torch.compile`` (Inductor) before capture (not in the
  default ``--modes``: the first calls compile for a minute or more; the median excludes the warm-up call).

A fast mode may carry ``+`` switches of ``decode_plan`` (docs/speed.md, "Decode-step variants"): ``+pad`` (LM head
padded to a multiple of 64 rows), ``+fuse`` (joined q|k|v and gate|up GEMMs, fused RMSNorms), ``+sdpa`` / ``+flex``
(the step's attention: SDPA ``enable_gqa`` / ``flex_attention`` instead of ``gqa_decode_attention``), ``+split``
(prompt keys/values read once per prompt, not per row; needs ``+fuse``); e.g.
``--modes fast,fast+pad+fuse,fast_compiled+pad+fuse``. ``--check`` then also compares each such mode with ``fast``.

Per mode: median wall time of a full call (after one warm-up call), tokens/s = N·T / wall, the
prefill time (the same call with one new token), decode-step latency = (wall - prefill) / (T - 1),
and peak memory. A profiler pass per mode attributes kernels to one decode step by differencing a
call with ``1 + --profile-steps`` tokens against a one-token call (``--trace`` writes each mode's
chrome trace). ``--check`` (default on) compares on device: fast vs reference tokens, greedy and
sampled with one seed (equal up to bf16 noise flipping near-ties: the shapes differ, B-row prefill and
a static cache), graph vs eager fast path (must be identical, greedy and sampled), and the fast path's
token_logp vs the teacher-forced ``completion_logprobs``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from projects.llava_sam2.rl_train.model.checkpoints.dtypes import as_torch_dtype
from projects.llava_sam2.rl_train.model.decoding.fast_generation import fast_sample_completions
from projects.llava_sam2.rl_train.model.decoding.generation import completion_logprobs, sample_completions
from projects.llava_sam2.rl_train.model.network.language import hf_llm_config
from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.network.transformers_seams import set_attention_implementation

PROG = "sa2va-rl bench decode"

# Qwen2.5-3B's published config (the LM inside Sa2VA-4B); docs/benchmarks.md records it.
QWEN25_3B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                 num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=32768,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def build_lm(name: str, device: torch.device, dtype: torch.dtype, lora_r: int = 0):
    """A random-weight causal LM built on ``device`` in ``dtype`` (no fp32 copy on the host); with ``lora_r`` > 0
    peft-wrapped like the RL policy (LoRA on every decoder linear, alpha = 2r, B drawn small so it is not a no-op)."""
    if name == "qwen2.5-3b":
        cfg = Qwen2Config(**QWEN25_3B)
    else:
        cfg = hf_llm_config(build_preset(name, vocab_size=512 if name == "tiny" else None).llm_config)
    set_attention_implementation(cfg, "sdpa")
    with device:
        lm = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)
    if lora_r > 0:
        from projects.llava_sam2.rl_train.model.network.lora import apply_lora

        lm = apply_lora(lm, r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0)
        with torch.no_grad():
            for param_name, param in lm.named_parameters():
                if "lora_B" in param_name:
                    param.normal_(0.0, 1e-3)
    return lm.eval()


def make_prompts(lm, batch: int, prompt_len: int, spread: int, seed: int):
    """B left-padded prompts: (embeds [B, L, D], attention [B, L]); row lengths L - spread .. L."""
    device = lm.get_input_embeddings().weight.device
    g = torch.Generator().manual_seed(seed)
    spread = min(spread, prompt_len - 1)
    lengths = [prompt_len - int(x) for x in torch.linspace(0, spread, batch).round()]
    ids = torch.randint(0, lm.config.vocab_size, (batch, prompt_len), generator=g)
    attention = torch.zeros(batch, prompt_len, dtype=torch.long)
    for b, n in enumerate(lengths):
        attention[b, prompt_len - n:] = 1
    ids, attention = ids.to(device), attention.to(device)
    with torch.no_grad():
        return lm.get_input_embeddings()(ids), attention


# ``+name`` of a fast mode -> the fast_sample_completions argument it sets
SWITCHES = {"pad": ("pad_head", True), "fuse": ("fuse_layers", True), "sdpa": ("decode_attention", "sdpa_gqa"),
            "flex": ("decode_attention", "flex"), "split": ("split_prompt_cache", True)}


def parse_mode(mode: str) -> tuple[str, dict]:
    """``"fast_compiled+pad+fuse"`` -> ``("fast_compiled", {"pad_head": True, "fuse_layers": True})``."""
    base, *switches = mode.split("+")
    unknown = [s for s in switches if s not in SWITCHES]
    if unknown or switches and base not in ("fast", "fast_eager", "fast_compiled"):
        raise SystemExit(f"{PROG}: mode {mode!r}: switches {sorted(SWITCHES)} go after fast, fast_eager or "
                         "fast_compiled (e.g. fast_compiled+pad+fuse)")
    return base, dict(SWITCHES[s] for s in switches)


def mode_call(mode: str, lm, embeds, attention, args, new_tokens: int, *, do_sample: bool = True,
              seed: int = 0, use_cuda_graph: bool | None = None):
    """One decode call of ``mode``; returns its output (Completions or generate ids)."""
    mode, plan = parse_mode(mode)
    G, device = args.num_generations, embeds.device
    never = [lm.config.vocab_size]  # never emitted: fixed-length decoding
    generator = torch.Generator(device=device).manual_seed(seed)
    sampling = dict(max_new_tokens=new_tokens, temperature=args.temperature, top_p=args.top_p, do_sample=do_sample)
    rows = embeds.repeat_interleave(G, 0), attention.repeat_interleave(G, 0)  # [N, L, D], [N, L]
    if mode == "hf_generate":
        return lm.generate(inputs_embeds=rows[0], attention_mask=rows[1], min_new_tokens=new_tokens, top_k=0,
                           eos_token_id=None, pad_token_id=0, **sampling)
    if mode == "reference":
        return sample_completions(lm, *rows, stop_token_ids=never, generator=generator, **sampling)
    graph = {"fast": use_cuda_graph, "fast_compiled": use_cuda_graph, "fast_eager": False}[mode]
    return fast_sample_completions(lm, embeds, attention, num_generations=G, stop_token_ids=never,
                                   generator=generator, use_cuda_graph=graph, compile_step=mode == "fast_compiled",
                                   **plan, **sampling)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeats: int) -> tuple[float, float]:
    """``(median, first)``: median wall seconds of ``fn()`` over ``repeats`` calls after one warm-up call, and the
    warm-up call's own seconds (compilation and other first-shape costs)."""
    times = []
    for _ in range(1 + repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]), times[0]


def bench_mode(mode: str, lm, embeds, attention, args) -> dict:
    device, T = embeds.device, args.new_tokens
    N = embeds.shape[0] * args.num_generations
    prefill_s, _ = timed(lambda: mode_call(mode, lm, embeds, attention, args, 1), device, args.repeats)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    wall_s, first_s = timed(lambda: mode_call(mode, lm, embeds, attention, args, T), device, args.repeats)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return {"wall_s": wall_s, "first_call_s": first_s, "tokens_per_s": N * T / wall_s, "prefill_s": prefill_s,
            "decode_step_ms": 1e3 * (wall_s - prefill_s) / max(T - 1, 1), "peak_gib": peak}


def _kernel_table(prof, device: torch.device) -> dict[str, tuple[int, float]]:
    """name -> (launches, device µs) of device kernels, memcpys and memsets (aten ops on a CPU run)."""
    table: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for evt in prof.events():
        is_kernel = evt.device_type == torch.autograd.DeviceType.CUDA
        if device.type == "cuda" and is_kernel or device.type == "cpu" and evt.name.startswith("aten::"):
            table[evt.name][0] += 1
            table[evt.name][1] += evt.device_time_total if device.type == "cuda" else evt.self_cpu_time_total
    return {name: (int(c), t) for name, (c, t) in table.items()}


def profile_step(mode: str, lm, embeds, attention, args, trace: str | None) -> dict:
    """Kernels of one decode step: (profile of 1 + s tokens) - (profile of 1 token), divided by s."""
    from torch.profiler import ProfilerActivity, profile

    device, s = embeds.device, args.profile_steps
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    tables = []
    for new_tokens in (1, 1 + s):
        mode_call(mode, lm, embeds, attention, args, new_tokens)  # warm-up outside the profile
        _sync(device)
        with profile(activities=activities) as prof:
            mode_call(mode, lm, embeds, attention, args, new_tokens)
            _sync(device)
        tables.append(_kernel_table(prof, device))
    if trace:
        prof.export_chrome_trace(f"{trace}.{mode}.json")
    short, long = tables
    per_step = {name: ((c - short.get(name, (0, 0.0))[0]) / s, (t - short.get(name, (0, 0.0))[1]) / s)
                for name, (c, t) in long.items()}
    top = sorted(per_step.items(), key=lambda kv: -kv[1][1])[:args.top_kernels]
    return {"kernels_per_step": sum(c for c, _ in per_step.values()),
            "device_ms_per_step": sum(t for _, t in per_step.values()) / 1e3,
            "top": [{"name": n[:120], "launches": c, "us": t} for n, (c, t) in top]}


def check(lm, embeds, attention, args) -> dict:
    """On-device agreement: fast vs reference (greedy), graph vs eager fast path, token_logp vs teacher forcing."""
    T, G = args.check_tokens, args.num_generations
    fast = mode_call("fast", lm, embeds, attention, args, T, do_sample=False)
    if args.check_scope == "variants":
        return {mode: compare_with_fast(mode, lm, embeds, attention, args, fast)
                for mode in args.modes.split(",") if "+" in mode}
    ref = mode_call("reference", lm, embeds, attention, args, T, do_sample=False)
    out = {"greedy_rows_equal_reference": float((fast.ids == ref.ids).all(-1).float().mean()),
           "greedy_tokens_equal_reference": float((fast.ids == ref.ids).float().mean()),
           "first_token_equal_reference": float((fast.ids[:, 0] == ref.ids[:, 0]).float().mean())}
    if embeds.device.type == "cuda":
        eager = mode_call("fast_eager", lm, embeds, attention, args, T, do_sample=False)
        out["graph_equals_eager"] = bool(torch.equal(fast.ids, eager.ids))
        sampled = [mode_call("fast", lm, embeds, attention, args, T, seed=7, use_cuda_graph=g) for g in (True, False)]
        out["sampled_graph_equals_eager"] = bool(torch.equal(sampled[0].ids, sampled[1].ids))
    if "fast_compiled" in args.modes.split(","):  # Inductor reorders float math: near-ties may flip in bf16
        compiled = mode_call("fast_compiled", lm, embeds, attention, args, T, do_sample=False)
        out["compiled_greedy_tokens_equal_fast"] = float((compiled.ids == fast.ids).float().mean())
        out["compiled_first_token_equal_fast"] = float((compiled.ids[:, 0] == fast.ids[:, 0]).float().mean())
    for mode in [m for m in args.modes.split(",") if "+" in m]:
        out[mode] = compare_with_fast(mode, lm, embeds, attention, args, fast)
    sampled = mode_call("fast", lm, embeds, attention, args, T, seed=3)
    sampled_ref = mode_call("reference", lm, embeds, attention, args, T, seed=3)  # same seed: same draws
    out["sampled_tokens_equal_reference"] = float((sampled.ids == sampled_ref.ids).float().mean())
    with torch.no_grad():
        teacher = completion_logprobs(lm, embeds.repeat_interleave(G, 0), attention.repeat_interleave(G, 0),
                                      sampled.ids, sampled.completion_mask, temperature=args.temperature)
    out["token_logp_max_abs_diff_teacher"] = float((teacher - sampled.token_logp).abs().max())
    return out


def compare_with_fast(mode: str, lm, embeds, attention, args, fast_greedy) -> dict:
    """A ``+`` variant against plain ``fast``: greedy and seeded tokens, and token_logp wherever the row so far is
    the same (bf16 noise may flip a near-tie; past it the rows are different continuations)."""
    T = args.check_tokens
    out = {}
    for name, seed, reference in (("greedy", None, fast_greedy),
                                  ("sampled", 3, mode_call("fast", lm, embeds, attention, args, T, seed=3))):
        got = mode_call(mode, lm, embeds, attention, args, T, do_sample=seed is not None, seed=seed or 0)
        same = got.ids == reference.ids  # [N, T]
        same_so_far = same.long().cumprod(-1).bool()
        out[f"{name}_tokens_equal_fast"] = float(same.float().mean())
        out[f"{name}_first_token_equal_fast"] = float(same[:, 0].float().mean())
        out[f"{name}_token_logp_max_abs_diff_fast"] = float((got.token_logp - reference.token_logp)[same_so_far]
                                                            .abs().max())
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--lm", default="qwen2.5-3b", choices=["qwen2.5-3b", "tiny", "1b", "4b", "8b"],
                   help="LM shape: Qwen2.5-3B's config, or a Sa2VA preset's llm_config (tiny: vocab 512)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cpu-threads", type=int, default=1, help="intra-op threads on CPU (tiny smoke runs)")
    p.add_argument("--dtype", default=None, help="bfloat16 (default on CUDA) / float32 (default on CPU)")
    p.add_argument("--batch", type=int, default=8, help="B prompts")
    p.add_argument("--num-generations", type=int, default=8, help="G samples per prompt (N = B*G rows)")
    p.add_argument("--prompt-len", type=int, default=1850, help="L: ~7 tiles x 256 image tokens + text")
    p.add_argument("--length-spread", type=int, default=64, help="prompt lengths span L-spread..L")
    p.add_argument("--new-tokens", type=int, default=128, help="T tokens per row (fixed length)")
    p.add_argument("--lora-r", type=int, default=0,
                   help="> 0: decode through peft LoRA adapters of this rank on every linear (the RL policy's shape)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0, help="< 1 adds the nucleus sort to every step")
    p.add_argument("--modes", default="hf_generate,reference,fast_eager,fast")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per mode (median)")
    p.add_argument("--profile-steps", type=int, default=8, help="decode steps in the profiled call (0: skip)")
    p.add_argument("--top-kernels", type=int, default=15)
    p.add_argument("--check-tokens", type=int, default=16, help="new tokens of the --check calls")
    p.add_argument("--no-check", dest="check", action="store_false")
    p.add_argument("--check-scope", choices=["all", "variants"], default="all",
                   help="variants: only compare the + modes with fast (no reference decode)")
    p.add_argument("--json", default=None, help="write all figures here (rewritten after each mode)")
    p.add_argument("--keep-going", action="store_true",
                   help="a mode that raises is recorded under 'errors' and the others still run")
    p.add_argument("--trace", default=None, help="chrome-trace path prefix (<prefix>.<mode>.json)")
    return p.parse_args(argv)


def run_benchmark(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns what ``--json`` writes."""
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.cpu_threads)
    dtype = as_torch_dtype(args.dtype or ("bfloat16" if device.type == "cuda" else "float32"), "--dtype")
    modes = [m for m in args.modes.split(",") if not (parse_mode(m)[0] == "fast_eager" and device.type != "cuda")]
    lm = build_lm(args.lm, device, dtype, args.lora_r)
    embeds, attention = make_prompts(lm, args.batch, args.prompt_len, args.length_spread, seed=0)
    report = {"config": {**vars(args), "dtype": str(dtype), "N": args.batch * args.num_generations,
                         "params_b": sum(p.numel() for p in lm.parameters()) / 1e9, "torch": torch.__version__,
                         "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"},
              "modes": {}, "profile": {}}
    for mode in modes:  # the JSON is rewritten after each mode: a run cut short by a timeout keeps what it measured
        try:
            report["modes"][mode] = bench_mode(mode, lm, embeds, attention, args)
            if args.profile_steps > 0:
                report["profile"][mode] = profile_step(mode, lm, embeds, attention, args, args.trace)
        except Exception as error:  # noqa: BLE001 -- one failing variant must not cost the others' figures
            if not args.keep_going:
                raise
            report.setdefault("errors", {})[mode] = f"{type(error).__name__}: {error}"[:2000]
            args.modes = ",".join(m for m in args.modes.split(",") if m != mode)  # nothing to check it against
        write_json(report, args.json)
    if args.check:
        report["check"] = check(lm, embeds, attention, args)
    write_json(report, args.json)
    print_table(report)
    return report


def write_json(report: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)


def print_table(report: dict) -> None:
    c = report["config"]
    print(f"{c['lm']} ({c['params_b']:.2f} B params, {c['dtype']}) on {c['device_name']}: B={c['batch']} "
          f"G={c['num_generations']} N={c['N']} L={c['prompt_len']} T={c['new_tokens']} top_p={c['top_p']}")
    print(f"{'mode':<26} {'tok/s':>9} {'wall s':>8} {'prefill s':>10} {'step ms':>8} {'peak GiB':>9} "
          f"{'kernels/step':>13} {'dev ms/step':>12}")
    for mode, r in report["modes"].items():
        prof = report["profile"].get(mode, {})
        print(f"{mode:<26} {r['tokens_per_s']:>9.1f} {r['wall_s']:>8.3f} {r['prefill_s']:>10.3f} "
              f"{r['decode_step_ms']:>8.2f} {r['peak_gib']:>9.2f} {prof.get('kernels_per_step', float('nan')):>13.1f} "
              f"{prof.get('device_ms_per_step', float('nan')):>12.3f}")
    for mode, error in report.get("errors", {}).items():
        print(f"{mode:<26} failed: {error[:300]}")
    if "check" in report:
        print("check:", json.dumps(report["check"]))


def main(argv: list[str] | None = None) -> int:
    run_benchmark(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
