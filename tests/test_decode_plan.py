"""model/decoding/decode_plan.py: the decode-step variants (padded head, fused layers, attention kinds, compiled)
against the reference decoder on tiny random LMs (CPU, fp32): the same tokens, token_logp within 1e-5."""
from functools import partial

import pytest
import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from projects.llava_sam2.rl_train.model.decoding import fast_decode_step
from projects.llava_sam2.rl_train.model.decoding.adapter_merge import MERGED_WEIGHT, merged_adapters
from projects.llava_sam2.rl_train.model.decoding.decode_plan import (FusedLayer, build_step_plan,
                                                                     flex_decode_attention, sdpa_gqa_decode_attention)
from projects.llava_sam2.rl_train.model.decoding.fast_generation import (DECODE_BACKENDS, decode_completions,
                                                                         fast_sample_completions)
from projects.llava_sam2.rl_train.model.decoding.generation import sample_completions
from grpo_tiny import one_thread
from tiny_lms import embedded_prompts, left_padded_embeds, tiny_causal_lm

VOCAB = 93  # odd, as Sa2VA-4B's 151,679: the padded head has 128 rows
NEVER = VOCAB + 1  # a stop id no row can emit
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, initializer_range=0.2)
ALL_SWITCHES = dict(fuse_layers=True, pad_head=True)


_one_thread = pytest.fixture(autouse=True)(one_thread)
prompts = embedded_prompts


def tiny_lm(arch: str = "qwen2", seed: int = 0):
    return tiny_causal_lm(arch, seed, **SIZES)


def reference(lm, embeds, attention, G, seed=None, **kw):
    rows = embeds.repeat_interleave(G, 0), attention.repeat_interleave(G, 0)
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return sample_completions(lm, *rows, generator=generator, do_sample=seed is not None, **kw)


def fast(lm, embeds, attention, G, seed=None, decoder=fast_sample_completions, **kw):
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return decoder(lm, embeds, attention, num_generations=G, generator=generator, do_sample=seed is not None, **kw)


def assert_same_completions(got, ref):
    assert torch.equal(got.ids, ref.ids)
    assert torch.equal(got.completion_mask, ref.completion_mask)
    torch.testing.assert_close(got.token_logp, ref.token_logp, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch, attention", [("qwen2", "grouped"), ("qwen2", "sdpa_gqa"), ("qwen2", "flex"),
                                             ("llama", "grouped"), ("qwen3", "sdpa_gqa")])
def test_every_variant_decodes_the_reference_tokens(arch, attention):
    """Greedy and seeded top-p sampling with stops: each switch combination gives the reference's tokens and
    token_logp (qwen3's layers keep their own forward: per-head q/k norms; the head is still padded)."""
    lm = tiny_lm(arch)
    embeds, attention_mask = prompts(lm, [5, 9, 7])
    kw = dict(max_new_tokens=9, temperature=0.8, top_p=0.9, stop_token_ids=[*range(1, 9), NEVER])
    masks = []
    for seed in (None, 4):
        ref = reference(lm, embeds, attention_mask, 2, seed, **kw)
        got = fast(lm, embeds, attention_mask, 2, seed, decode_attention=attention, **ALL_SWITCHES, **kw)
        assert_same_completions(got, ref)
        masks.append(ref.completion_mask)
    assert sum(m.sum() for m in masks) > 30 and not all(m.all() for m in masks)  # some rows stop, some run on
    plan = build_step_plan(lm.model.layers, lm.lm_head, default_attention="sdpa", **ALL_SWITCHES)
    assert plan.head_weight.shape[0] == 128  # the padded head did run
    assert all((layer is None) == (arch == "qwen3") for layer in plan.layers)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_split_prompt_cache_decodes_the_reference_tokens(arch):
    """Prompt keys/values kept once per prompt (G = 3 rows read them), new ones per row: one softmax over both."""
    lm = tiny_lm(arch)
    embeds, attention = prompts(lm, [5, 9, 7])
    kw = dict(max_new_tokens=9, temperature=0.8, top_p=0.9, stop_token_ids=[*range(1, 9), NEVER])
    for seed in (None, 4):
        got = fast(lm, embeds, attention, 3, seed, split_prompt_cache=True, **ALL_SWITCHES, **kw)
        assert_same_completions(got, reference(lm, embeds, attention, 3, seed, **kw))
    with pytest.raises(ValueError, match="split_prompt_cache"):  # Qwen3 layers do not fuse
        fast(tiny_lm("qwen3"), embeds, attention, 3, split_prompt_cache=True, **ALL_SWITCHES, **kw)


def test_split_prompt_cache_continues_a_shared_prefix_prefill():
    """prefix=SharedPrefix (the partner passes' image blocks): the split cache holds the joined prefix+own-token rows
    of the prefill, G = 1 and 2, and decodes the reference's seeded tokens on the joined prompts."""
    from projects.llava_sam2.rl_train.model.decoding.generation import SharedPrefix

    lm = tiny_lm()
    g = torch.Generator().manual_seed(3)
    heads = [torch.randint(1, VOCAB, (n,), generator=g) for n in (6, 4)]  # 2 distinct prefixes
    tails = [torch.randint(1, VOCAB, (n,), generator=g) for n in (3, 5, 2)]  # 3 rows' own tokens
    index = torch.tensor([0, 1, 0])

    left_padded = partial(left_padded_embeds, lm)

    whole = left_padded([torch.cat([heads[i], tail]) for i, tail in zip(index.tolist(), tails)])
    kw = dict(max_new_tokens=6, temperature=0.9, stop_token_ids=[NEVER])
    for G in (1, 2):
        got = fast(lm, *left_padded(tails), G, 1, prefix=SharedPrefix(*left_padded(heads), index),
                   split_prompt_cache=True, **ALL_SWITCHES, **kw)
        assert_same_completions(got, reference(lm, *whole, G, 1, **kw))


def test_split_prompt_cache_shares_grouped_prefixes_once(monkeypatch, generations=(1, 2), max_new_tokens=6):
    """Rows about one image next to each other (index 0,0,0,1,1,1): the split cache keeps the 2 prefixes as its shared
    part and each row's own tokens in its tail, and decodes the reference's seeded tokens on the joined prompts."""
    from projects.llava_sam2.rl_train.model.decoding import decode_plan, fast_generation
    from projects.llava_sam2.rl_train.model.decoding.generation import SharedPrefix

    lm = tiny_lm()
    g = torch.Generator().manual_seed(5)
    heads = [torch.randint(1, VOCAB, (n,), generator=g) for n in (6, 4)]
    tails = [torch.randint(1, VOCAB, (n,), generator=g) for n in (3, 5, 2, 4, 1, 3)]
    index = torch.tensor([0, 0, 0, 1, 1, 1])
    assert fast_generation.grouped_prefix_rows(SharedPrefix(None, torch.ones(2, 6), index)) == 3
    assert fast_generation.grouped_prefix_rows(SharedPrefix(None, torch.ones(2, 6), index.flip(0))) is None
    shared_rows = []
    built = decode_plan.SplitPromptCache.of
    monkeypatch.setattr(decode_plan.SplitPromptCache, "of", lambda *a, **k: shared_rows.append(
        a[0][0][0].shape[0]) or built(*a, **k))

    left_padded = partial(left_padded_embeds, lm)

    whole = left_padded([torch.cat([heads[i], tail]) for i, tail in zip(index.tolist(), tails)])
    kw = dict(max_new_tokens=max_new_tokens, temperature=0.9, stop_token_ids=[NEVER])
    for G in generations:
        got = fast(lm, *left_padded(tails), G, 1, prefix=SharedPrefix(*left_padded(heads), index),
                   split_prompt_cache=True, **ALL_SWITCHES, **kw)
        assert_same_completions(got, reference(lm, *whole, G, 1, **kw))
    assert shared_rows == [2] * len(generations)  # the 2 prefixes, not the 6 rows


def test_padded_head_columns_are_never_chosen():
    """The padded rows give logit 0; with every real logit near -10 a leaked padded column would win every argmax
    and nearly every draw (ids >= V) and change token_logp's normaliser. Sliced off, the tokens are the reference's."""
    lm = tiny_lm()
    head = nn.Linear(32, VOCAB, bias=True)
    with torch.no_grad():
        head.weight.copy_(lm.lm_head.weight * 0.05)
        head.bias.fill_(-10.0)
    lm.lm_head = head
    embeds, attention = prompts(lm, [6, 8])
    kw = dict(max_new_tokens=8, stop_token_ids=[NEVER])
    for seed in (None, 3):
        got = fast(lm, embeds, attention, 3, seed, pad_head=True, **kw)
        assert int(got.ids.max()) < VOCAB
        assert_same_completions(got, reference(lm, embeds, attention, 3, seed, **kw))
    plan = build_step_plan(lm.model.layers, lm.lm_head, default_attention="sdpa", pad_head=True)
    assert plan.head_bias.shape == (128,) and float(plan.logits(lm.lm_head, torch.zeros(1, 32)).max()) < -9


def test_fusion_reads_plain_and_merged_linears_but_not_live_adapters():
    """A LoRA layer whose adapters still compute is not fused (its GEMM alone would drop B A x); inside
    merged_adapters the joined weights are the merged scratch weights, and the decode equals the adapted reference."""
    from projects.llava_sam2.rl_train.model.network.lora import apply_lora

    lm = apply_lora(tiny_lm(), r=4, lora_alpha=8, lora_dropout=0.0).eval()
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    layer = lm.base_model.model.model.layers[0]
    assert FusedLayer.of(layer) is None
    with merged_adapters(lm):
        fused = FusedLayer.of(layer)
        attn = layer.self_attn
        expected = torch.cat([getattr(attn, n).__dict__[MERGED_WEIGHT] for n in ("q_proj", "k_proj", "v_proj")])
        assert torch.equal(fused.qkv_weight, expected)
    embeds, attention = prompts(lm, [4, 7])
    kw = dict(max_new_tokens=8, stop_token_ids=[NEVER])
    expected = reference(lm, embeds, attention, 2, 5, **kw)
    for backend in ("fast_fused", "fast_fused_sdpa"):
        got = fast(lm, embeds, attention, 2, 5, decoder=partial(decode_completions, decode_backend=backend), **kw)
        assert_same_completions(got, expected)


@pytest.mark.parametrize("attention_fn", [sdpa_gqa_decode_attention, flex_decode_attention])
def test_attention_kinds_equal_repeat_kv_sdpa(attention_fn):
    g = torch.Generator().manual_seed(0)
    N, H, Hkv, S, hd = 3, 6, 2, 11, 8
    query = torch.randn(N, H, 1, hd, generator=g)
    key, value = torch.randn(N, Hkv, S, hd, generator=g), torch.randn(N, Hkv, S, hd, generator=g)
    bias = torch.zeros(N, 1, 1, S).masked_fill(torch.rand(N, 1, 1, S, generator=g) < 0.4, torch.finfo().min)
    bias[..., 0] = 0.0
    module = nn.Module()
    module.num_key_value_groups = H // Hkv
    out, _ = attention_fn(module, query, key, value, bias, scaling=0.3)
    expected, _ = sdpa_attention_forward(module, query, key, value, bias, scaling=0.3)
    assert out.shape == expected.shape == (N, 1, H, hd)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


class GraphList(list):
    def __init__(self):
        super().__init__()
        self.others: list[str] = []


def graph_kind(graph_module) -> str:
    """What a traced graph of a compiled decode call is, by its inputs' names: the step (reads the decode state), a
    prefill layer call (reads the prompts' states) or the token choice (reads the logits)."""
    inputs = " ".join(node.name for node in graph_module.graph.nodes if node.op == "placeholder")
    return "layer" if "h_prefix" in inputs else "choice" if "logits" in inputs else "step"


@pytest.fixture
def step_graphs(monkeypatch):
    """The graphs the compiled decode step traces, in order (its backend swapped for one that counts them; the
    prefill's layer calls and the token choice, compiled with it, are counted apart in ``.others``); the test starts
    and ends with no compiled code."""
    graphs = GraphList()

    def counting_backend(graph_module, example_inputs):
        kind = graph_kind(graph_module)
        (graphs if kind == "step" else graphs.others).append(kind)
        return graph_module.forward

    monkeypatch.setattr(fast_decode_step, "COMPILE_BACKEND", counting_backend)
    torch.compiler.reset()
    yield graphs
    torch.compiler.reset()


def test_compiled_fused_step_equals_the_reference_and_a_second_call_compiles_nothing(step_graphs):
    """compile_step with every switch: the first call traces the step, a second call of the same shapes reuses it
    (new state, cache and scratch weights are inputs of the graph, not constants)."""
    lm = tiny_lm()
    embeds, attention = prompts(lm, [5, 9, 7])
    kw = dict(max_new_tokens=6, temperature=0.8, top_p=0.9, stop_token_ids=[NEVER])
    ref = reference(lm, embeds, attention, 2, 4, **kw)
    switches = dict(**ALL_SWITCHES, split_prompt_cache=True)
    first = fast(lm, embeds, attention, 2, 4, compile_step=True, **switches, **kw)
    compiled = len(step_graphs)
    assert compiled >= 1
    second = fast(lm, embeds, attention, 2, 4, compile_step=True, **switches, **kw)
    assert len(step_graphs) == compiled
    assert_same_completions(first, ref)
    assert_same_completions(second, ref)
    fast(lm, embeds, attention, 2, 4, compile_step=True, **switches, **{**kw, "temperature": 0.7})
    assert len(step_graphs) > compiled  # a new temperature (a constant of the step) does compile: the count sees it


@pytest.mark.parametrize("backend", ["fast_compiled", "fast_fused_sdpa_compiled", "fast_fused_split_compiled"])
def test_compiled_step_compiles_once_for_calls_of_every_shape(backend, step_graphs):
    """The decode backend's compiled step traces one graph on its first call and runs calls of other prompt counts,
    prompt lengths, group sizes and lengths (N rows, S slots, T columns, L) on it (with the split cache: of other
    prompt lengths and lengths): the RL step's length buckets and call sites compile once per process. The first call
    has N = T = 6 (the kept states are [6, 6, D]): equal sizes are still separate symbols. Each call gives the
    uncompiled step's tokens, token_logp and kept states."""
    switches = {k: v for k, v in DECODE_BACKENDS[backend].keywords.items() if k != "compile_step"}
    assert DECODE_BACKENDS[backend].keywords["compile_step"]
    lm = tiny_lm()
    shapes = [([5, 9, 7], 2, 6), ([4, 60], 3, 9), ([3, 8, 11, 6], 2, 12)]  # N 6, 6, 8; S 64, 128, 64
    if switches.get("split_prompt_cache"):  # its rows stay constants (fast_decode_step.mark_step_sizes_symbolic)
        shapes = [([5, 9, 7], 2, 6), ([4, 60, 8], 2, 9), ([3, 8, 11], 2, 12)]
    for lengths, G, T in shapes:
        embeds, attention = prompts(lm, lengths)
        kw = dict(max_new_tokens=T, temperature=0.8, top_p=0.9, stop_token_ids=[NEVER], return_hidden=True)
        got = fast(lm, embeds, attention, G, 4, decoder=partial(decode_completions, decode_backend=backend), **kw)
        eager = fast(lm, embeds, attention, G, 4, **switches, **kw)
        assert_same_completions(got, eager)
        torch.testing.assert_close(got.hidden, eager.hidden, atol=1e-5, rtol=0)
        assert len(step_graphs) == 1, f"{backend}: call {lengths, G, T} compiled graph {len(step_graphs)}"
        # the prefill's layer call: one graph for every shape too (top-p on: the choice stays eager)
        assert step_graphs.others == ["layer"], step_graphs.others


def test_bench_decode_runs_the_switched_modes_on_cpu():
    from projects.llava_sam2.rl_train.benchmarks import decode as bench

    modes = "fast,fast+pad+fuse,fast+fuse+sdpa,fast+fuse+split,fast+split"  # the last one raises: split needs fuse
    report = bench.run_benchmark(["--lm", "tiny", "--device", "cpu", "--batch", "2", "--num-generations", "2",
                                  "--prompt-len", "12", "--new-tokens", "4", "--repeats", "1", "--profile-steps", "0",
                                  "--check-tokens", "4", "--check-scope", "variants", "--modes", modes,
                                  "--keep-going"])
    assert set(report["modes"]) == set(modes.split(",")[:-1])
    assert "split_prompt_cache" in report["errors"]["fast+split"] and "fast+split" not in report["check"]
    for mode in ("fast+pad+fuse", "fast+fuse+sdpa", "fast+fuse+split"):
        assert report["check"][mode]["greedy_tokens_equal_fast"] == 1.0
        assert report["check"][mode]["sampled_tokens_equal_fast"] == 1.0
        assert report["check"][mode]["sampled_token_logp_max_abs_diff_fast"] < 1e-5
    with pytest.raises(SystemExit):
        bench.parse_mode("reference+pad")
