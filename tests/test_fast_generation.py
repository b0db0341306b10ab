"""model/decoding/fast_generation.py against the reference decoder (model/decoding/generation.py) on tiny random LMs (CPU).

The fast path prefills B prompts once and decodes N = B·G rows with a static cache and a fixed-shape
step; on CPU that step runs eagerly, so these tests check the math the CUDA graph replays.
"""
from functools import partial

import pytest
import torch
from transformers import TopPLogitsWarper
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from projects.llava_sam2.rl_train.model.decoding.fast_decode_step import gqa_decode_attention
from projects.llava_sam2.rl_train.model.decoding.fast_generation import fast_sample_completions
from projects.llava_sam2.rl_train.model.decoding.generation import (completion_logprobs, position_ids_from_attention,
                                                           sample_completions)
from grpo_tiny import one_thread
from tiny_lms import embedded_prompts, left_padded_embeds, tiny_causal_lm

VOCAB, D = 96, 32
NEVER = VOCAB + 1  # a stop id no row can emit: fixed-length decoding
SIZES = dict(vocab_size=VOCAB, hidden_size=D, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0,
             initializer_range=0.2)  # peaked logits: a greedy argmax is not decided by float noise


_one_thread = pytest.fixture(autouse=True)(one_thread)
prompts = embedded_prompts


def tiny_lm(arch: str = "qwen2", seed: int = 0, **overrides):
    return tiny_causal_lm(arch, seed, **{**SIZES, **overrides})


def per_row(embeds, attention, G):
    """The N = B·G prompt rows the reference decodes (row b·G + g = prompt b)."""
    return embeds.repeat_interleave(G, 0), attention.repeat_interleave(G, 0)


def assert_same_completions(fast, ref):
    assert torch.equal(fast.ids, ref.ids)
    assert torch.equal(fast.completion_mask, ref.completion_mask)
    assert torch.equal(fast.is_truncated, ref.is_truncated)
    torch.testing.assert_close(fast.token_logp, ref.token_logp, atol=1e-5, rtol=0)


@pytest.mark.parametrize("stop_check_interval", [1, 3])
def test_greedy_equals_reference_with_groups_stops_and_truncation(stop_check_interval):
    lm = tiny_lm()
    embeds, attention = prompts(lm, [5, 9, 7, 3])
    G, kw = 3, dict(max_new_tokens=9, do_sample=False, pad_token_id=0, stop_check_interval=stop_check_interval)
    free = sample_completions(lm, *per_row(embeds, attention, G), stop_token_ids=[NEVER], **kw)
    stop_id = int(free.ids[3, 2])  # row 3 (prompt 1) stops mid-sequence at column 2
    ref = sample_completions(lm, *per_row(embeds, attention, G), stop_token_ids=[stop_id, NEVER], **kw)
    fast = fast_sample_completions(lm, embeds, attention, num_generations=G, stop_token_ids=[stop_id, NEVER], **kw)
    assert_same_completions(fast, ref)
    assert fast.ids.shape[0] == 12 and not fast.is_truncated[3] and fast.is_truncated.any()
    assert fast.completion_mask[3].tolist() == [True] * 3 + [False] * (fast.ids.shape[1] - 3)
    assert bool((fast.ids[3, 3:] == 0).all())


@pytest.mark.parametrize("arch, overrides", [
    ("llama", {}),
    ("llama", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}),  # InternLM2 (8b) rope, below its limit
    ("phi3", {"num_key_value_heads": 4}),
    ("phi3", {"rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3],  # below its switch
                               "long_factor": [2.0] * 4}, "original_max_position_embeddings": 4096}),
    ("qwen2", {"num_key_value_heads": 1}),
    ("qwen3", {"head_dim": 12}),  # q_norm/k_norm per head; a head size that is not hidden / heads (8)
])
def test_greedy_equals_reference_for_other_architectures(arch, overrides):
    lm = tiny_lm(arch, **overrides)
    embeds, attention = prompts(lm, [6, 2, 8])
    kw = dict(max_new_tokens=7, do_sample=False, stop_token_ids=[NEVER])
    ref = sample_completions(lm, *per_row(embeds, attention, 2), **kw)
    assert_same_completions(fast_sample_completions(lm, embeds, attention, num_generations=2, **kw), ref)


@pytest.mark.parametrize("preset", ["tiny", "tiny_qwen3"])
def test_sa2va_tiny_language_model_greedy_equals_reference(preset):
    from projects.llava_sam2.rl_train.model.network.language import build_language_model
    from projects.llava_sam2.rl_train.model.network.presets import build_preset

    torch.manual_seed(0)
    lm = build_language_model(build_preset(preset, vocab_size=VOCAB).llm_config).eval()
    embeds, attention = prompts(lm, [4, 11])
    kw = dict(max_new_tokens=6, do_sample=False, stop_token_ids=[NEVER])
    ref = sample_completions(lm, *per_row(embeds, attention, 2), **kw)
    assert_same_completions(fast_sample_completions(lm, embeds, attention, num_generations=2, **kw), ref)


def warped_reference_probs(lm, embeds, attention, out, temperature, top_p):
    """``softmax(top_p(logits / temperature))`` of a plain teacher-forced HF forward, ``[N, T, V]``."""
    L, T = embeds.shape[1], out.ids.shape[1]
    full_attention = torch.cat([attention, out.completion_mask.long()], 1)  # [N, L + T]
    with torch.no_grad():
        logits = lm(inputs_embeds=torch.cat([embeds, lm.get_input_embeddings()(out.ids)], 1),
                    attention_mask=full_attention,
                    position_ids=position_ids_from_attention(full_attention)).logits[:, L - 1:L + T - 1]
    warped = TopPLogitsWarper(top_p)(None, logits.float().flatten(0, 1) / temperature)  # [N*T, V]
    return warped.softmax(-1).view_as(logits)


def test_sampling_distributions_and_logprobs_match_the_reference_logits():
    lm = tiny_lm()
    embeds, attention = prompts(lm, [4, 8, 6])
    G, temperature, top_p = 4, 0.7, 0.8
    out, step_probs = fast_sample_completions(
        lm, embeds, attention, num_generations=G, max_new_tokens=10, temperature=temperature, top_p=top_p,
        stop_token_ids=[5], generator=torch.Generator().manual_seed(0), return_step_probs=True)
    rows = per_row(embeds, attention, G)
    expected = warped_reference_probs(lm, *rows, out, temperature, top_p)
    is_active = out.completion_mask
    assert is_active.sum() > 60
    torch.testing.assert_close(step_probs[is_active], expected[is_active], atol=1e-5, rtol=0)
    assert bool((expected[is_active] == 0).any())  # the nucleus really cut tokens
    drawn_p = step_probs.gather(-1, out.ids[..., None]).squeeze(-1)  # [N, T]
    assert bool((drawn_p[is_active] > 0).all())  # every draw is inside its nucleus
    with torch.no_grad():
        teacher = completion_logprobs(lm, *rows, out.ids, out.completion_mask, temperature=temperature)
    torch.testing.assert_close(out.token_logp, teacher, atol=1e-5, rtol=0)
    assert bool((out.token_logp[~is_active] == 0).all())


def test_sampling_with_the_reference_seed_draws_the_reference_tokens():
    """The exponential race is torch.multinomial's own draw, so one generator seed gives the same tokens."""
    lm = tiny_lm()
    embeds, attention = prompts(lm, [6, 3, 9])
    G, kw = 4, dict(max_new_tokens=12, temperature=0.8, top_p=0.9, stop_token_ids=list(range(1, 9)))
    ref = sample_completions(lm, *per_row(embeds, attention, G), generator=torch.Generator().manual_seed(11), **kw)
    fast = fast_sample_completions(lm, embeds, attention, num_generations=G,
                                   generator=torch.Generator().manual_seed(11), **kw)
    assert_same_completions(fast, ref)
    assert fast.is_truncated.any() and not fast.is_truncated.all() and fast.completion_mask.sum() > 40


def test_draws_follow_the_step_distributions():
    """E[onehot(c_t) - p_t | prefix] = 0 for a correct sampler: the mean over many rows and steps is ~0.
    A sampler of the wrong distribution (here: no temperature) shows a clear bias on the same draws."""
    lm = tiny_lm()
    embeds, attention = prompts(lm, [5, 7])
    out, step_probs = fast_sample_completions(
        lm, embeds, attention, num_generations=400, max_new_tokens=3, temperature=0.6, top_p=0.9,
        stop_token_ids=[NEVER], generator=torch.Generator().manual_seed(1), return_step_probs=True)
    onehot = torch.nn.functional.one_hot(out.ids, VOCAB).float()  # [N, T, V]
    n = onehot.shape[0] * onehot.shape[1]

    def max_z(probs):  # largest per-token z-score of the mean residual
        residual = (onehot - probs).flatten(0, 1).mean(0)  # [V]
        std = (probs * (1 - probs)).flatten(0, 1).mean(0).clamp_min(1e-4).div(n).sqrt()  # [V]
        return float((residual.abs() / std).max())

    assert max_z(step_probs) < 4.5  # ~2.5-3 expected for the max over V tokens of a standard normal
    rows = per_row(embeds, attention, 400)
    untempered = warped_reference_probs(lm, *rows, out, 1.0, 0.9)
    assert max_z(untempered) > 8.0


def test_seeded_sampling_repeats_and_shared_prefix_equals_per_row_prefill():
    lm = tiny_lm()
    embeds, attention = prompts(lm, [3, 9, 6])
    G = 3
    kw = dict(max_new_tokens=8, temperature=0.9, top_p=0.95, stop_token_ids=[7], return_step_probs=True)
    shared, shared_probs = fast_sample_completions(lm, embeds, attention, num_generations=G,
                                                   generator=torch.Generator().manual_seed(5), **kw)
    again, _ = fast_sample_completions(lm, embeds, attention, num_generations=G,
                                       generator=torch.Generator().manual_seed(5), **kw)
    other, _ = fast_sample_completions(lm, embeds, attention, num_generations=G,
                                       generator=torch.Generator().manual_seed(6), **kw)
    each, each_probs = fast_sample_completions(lm, *per_row(embeds, attention, G), num_generations=1,
                                               generator=torch.Generator().manual_seed(5), **kw)
    assert torch.equal(shared.ids, again.ids)
    assert not torch.equal(shared.ids, other.ids)
    assert_same_completions(shared, each)  # same noise per row and step, same prefix states
    torch.testing.assert_close(shared_probs, each_probs, atol=1e-6, rtol=0)
    assert not torch.equal(shared.ids[0], shared.ids[1])  # the G samples of a prompt differ


def test_peft_lora_and_disabled_adapter_match_the_reference():
    from projects.llava_sam2.rl_train.model.network.lora import apply_lora

    peft_lm = apply_lora(tiny_lm(), r=4, lora_alpha=8, lora_dropout=0.0).eval()
    with torch.no_grad():  # non-zero B, so the adapter changes the policy
        for name, p in peft_lm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    embeds, attention = prompts(peft_lm, [4, 7])
    kw = dict(max_new_tokens=8, do_sample=False, stop_token_ids=[NEVER])
    rows = per_row(embeds, attention, 2)
    adapted = fast_sample_completions(peft_lm, embeds, attention, num_generations=2, **kw)
    assert_same_completions(adapted, sample_completions(peft_lm, *rows, **kw))
    with peft_lm.disable_adapter():
        base = fast_sample_completions(peft_lm, embeds, attention, num_generations=2, **kw)
        assert_same_completions(base, sample_completions(peft_lm, *rows, **kw))
    assert not torch.equal(adapted.ids, base.ids)


def test_in_place_weight_change_between_calls_is_seen():
    """Weight sets swap by in-place copy; each call decodes with the values present at that call."""
    lm = tiny_lm()
    embeds, attention = prompts(lm, [5, 8])
    kw = dict(max_new_tokens=8, do_sample=False, stop_token_ids=[NEVER])
    before = fast_sample_completions(lm, embeds, attention, num_generations=2, **kw)
    with torch.no_grad():
        lm.model.layers[1].mlp.down_proj.weight.copy_(torch.randn_like(lm.model.layers[1].mlp.down_proj.weight))
    after = fast_sample_completions(lm, embeds, attention, num_generations=2, **kw)
    assert not torch.equal(before.ids, after.ids)
    assert_same_completions(after, sample_completions(lm, *per_row(embeds, attention, 2), **kw))


def test_both_decoders_return_the_fed_back_states_of_teacher_forcing():
    """return_hidden: hidden[:, t] is the final-norm state of input ids[:, t] as the decode computed it, equal to
    completion_hidden's teacher-forced states wherever the token was fed back; the last column is 0."""
    from projects.llava_sam2.rl_train.model.decoding.generation import completion_hidden

    lm = tiny_lm()
    embeds, attention = prompts(lm, [5, 9, 7])
    free = sample_completions(lm, embeds, attention, max_new_tokens=8, do_sample=False, stop_token_ids=[NEVER])
    kw = dict(max_new_tokens=8, do_sample=False, stop_token_ids=[int(free.ids[1, 2]), NEVER], return_hidden=True)
    ref = sample_completions(lm, *per_row(embeds, attention, 2), **kw)
    fast = fast_sample_completions(lm, embeds, attention, num_generations=2, **kw)
    assert_same_completions(fast, ref)
    with torch.no_grad():
        teacher = completion_hidden(lm, *per_row(embeds, attention, 2), ref.ids, ref.completion_mask)  # [N, T, D]
    T = ref.ids.shape[1]
    is_fed = torch.arange(T)[None] < ref.completion_mask.sum(-1, keepdim=True) - 1  # [N, T]
    assert is_fed.sum() > 20 and not is_fed.all()
    for out in (ref, fast):
        assert out.hidden.shape == teacher.shape
        torch.testing.assert_close(out.hidden[is_fed], teacher[is_fed], atol=1e-5, rtol=0)
        assert bool((out.hidden[:, -1] == 0).all())
    assert sample_completions(lm, embeds, attention, max_new_tokens=2, stop_token_ids=[NEVER]).hidden is None


def test_compiled_step_equals_the_reference(monkeypatch):
    """compile_step=True traces the step with torch.compile (the state/cache updates are in-place on its inputs).
    Checked with the aot_eager backend (no code generation, fast); Inductor itself is for the GPU benchmark."""
    from projects.llava_sam2.rl_train.model.decoding import fast_decode_step

    monkeypatch.setattr(fast_decode_step, "COMPILE_BACKEND", "aot_eager")
    lm = tiny_lm()
    embeds, attention = prompts(lm, [5, 9, 7])
    kw = dict(max_new_tokens=7, temperature=0.8, top_p=0.9, stop_token_ids=[NEVER])
    fast = fast_sample_completions(lm, embeds, attention, num_generations=2, compile_step=True,
                                   generator=torch.Generator().manual_seed(4), **kw)
    ref = sample_completions(lm, *per_row(embeds, attention, 2), generator=torch.Generator().manual_seed(4), **kw)
    assert_same_completions(fast, ref)
    greedy = dict(max_new_tokens=5, do_sample=False, stop_token_ids=[NEVER])
    shorter = fast_sample_completions(lm, embeds[1:], attention[1:], num_generations=4, compile_step=True, **greedy)
    assert_same_completions(shorter, sample_completions(lm, *per_row(embeds[1:], attention[1:], 4), **greedy))


def test_gqa_decode_attention_equals_repeat_kv_sdpa():
    g = torch.Generator().manual_seed(0)
    N, H, Hkv, S, hd = 3, 6, 2, 11, 8
    query = torch.randn(N, H, 1, hd, generator=g)
    key, value = torch.randn(N, Hkv, S, hd, generator=g), torch.randn(N, Hkv, S, hd, generator=g)
    is_hidden = torch.rand(N, 1, 1, S, generator=g) < 0.4
    bias = torch.zeros(N, 1, 1, S).masked_fill(is_hidden, torch.finfo(torch.float32).min)  # additive
    bias[..., 0] = 0.0
    module = torch.nn.Module()
    module.num_key_value_groups = H // Hkv
    out, _ = gqa_decode_attention(module, query, key, value, bias, scaling=0.3)
    expected, _ = sdpa_attention_forward(module, query, key, value, bias, scaling=0.3)
    assert out.shape == expected.shape == (N, 1, H, hd)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_bad_inputs_are_rejected():
    lm = tiny_lm()
    embeds, attention = prompts(lm, [3, 6])
    kw = dict(max_new_tokens=2, stop_token_ids=[1])
    with pytest.raises(ValueError, match="num_generations"):
        fast_sample_completions(lm, embeds, attention, num_generations=0, **kw)
    with pytest.raises(ValueError, match="left padded"):
        fast_sample_completions(lm, embeds, attention.flip(-1), **kw)
    with pytest.raises(ValueError, match="stop_token_ids"):
        fast_sample_completions(lm, embeds, attention, max_new_tokens=2, stop_token_ids=[])
    with pytest.raises(ValueError, match="use_cuda_graph"):
        fast_sample_completions(lm, embeds, attention, use_cuda_graph=True, **kw)
    with pytest.raises(ValueError, match="top_p"):
        fast_sample_completions(lm, embeds, attention, top_p=0.0, **kw)
    short = tiny_lm("llama", max_position_embeddings=32, rope_scaling={"type": "dynamic", "factor": 2.0})
    with pytest.raises(NotImplementedError, match="dynamic"):
        fast_sample_completions(short, embeds, attention, **kw)
    longrope = tiny_lm("phi3", original_max_position_embeddings=32,
                       rope_scaling={"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4})
    with pytest.raises(NotImplementedError, match="longrope"):
        fast_sample_completions(longrope, embeds, attention, **kw)

    class BodylessLM(torch.nn.Module):
        def get_decoder(self):
            return torch.nn.Identity()

        def get_output_embeddings(self):
            return lm.lm_head

    with pytest.raises(TypeError, match="rotary_emb"):
        fast_sample_completions(BodylessLM(), embeds, attention, **kw)


@pytest.mark.parametrize("bad", [dict(num_generations=0), dict(num_generations=2.0), dict(max_new_tokens=0),
                                 dict(temperature=0.0), dict(top_p=1.5), dict(stop_check_interval=0),
                                 dict(stop_token_ids=[])])
def test_every_decoder_rejects_bad_arguments_alike(bad):
    """The decoders of DECODE_BACKENDS share one argument check: the same words for the same mistake."""
    from projects.llava_sam2.rl_train.model.decoding.fast_generation import DECODE_BACKENDS

    lm = tiny_lm()
    embeds, attention = prompts(lm, [3, 6])
    messages = {}
    for name, decode in DECODE_BACKENDS.items():
        with pytest.raises(ValueError) as error:
            decode(lm, embeds, attention, **{**dict(max_new_tokens=2, stop_token_ids=[1]), **bad})
        messages[name] = str(error.value).split(": ", 1)[1]  # the text after the reporting function's name
    assert len(set(messages.values())) == 1, messages


def test_bench_decode_tool_runs_on_cpu(tmp_path):
    import json

    from projects.llava_sam2.rl_train.benchmarks import decode as bench

    out = tmp_path / "decode.json"
    report = bench.run_benchmark(["--lm", "tiny", "--device", "cpu", "--batch", "2", "--num-generations", "2",
                         "--prompt-len", "12", "--new-tokens", "4", "--repeats", "1", "--profile-steps", "2",
                         "--check-tokens", "4", "--json", str(out)])
    assert set(report["modes"]) == {"hf_generate", "reference", "fast"}
    assert all(r["tokens_per_s"] > 0 for r in report["modes"].values())
    assert report["profile"]["fast"]["kernels_per_step"] > 0
    assert report["check"]["greedy_rows_equal_reference"] == 1.0
    assert report["check"]["token_logp_max_abs_diff_teacher"] < 1e-5
    assert json.loads(out.read_text())["config"]["N"] == 4


@pytest.mark.parametrize("do_sample", [False, True])
def test_shared_prefix_prefill_equals_the_joined_prompts(do_sample):
    """prefix=SharedPrefix: the U distinct prefixes are prefilled once, the rows' own tokens continue from them; the
    completions equal the reference decoding each row's plain left-padded prompt [prefix | own tokens]."""
    from projects.llava_sam2.rl_train.model.decoding.generation import SharedPrefix

    lm = tiny_lm()
    g = torch.Generator().manual_seed(3)
    heads = [torch.randint(1, VOCAB, (n,), generator=g) for n in (6, 4)]  # U = 2 prefixes
    tails = [torch.randint(1, VOCAB, (n,), generator=g) for n in (3, 5, 2)]  # n = 3 rows
    index = torch.tensor([0, 1, 0])

    left_padded = partial(left_padded_embeds, lm)

    prefix = SharedPrefix(*left_padded(heads), index)
    rest = left_padded(tails)
    whole = left_padded([torch.cat([heads[i], tail]) for i, tail in zip(index.tolist(), tails)])
    seen = []
    hook = lm.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(tuple(kwargs["inputs_embeds"].shape[:2])), with_kwargs=True)
    kw = dict(max_new_tokens=6, do_sample=do_sample, temperature=0.9, stop_token_ids=[NEVER])
    fast = fast_sample_completions(lm, *rest, num_generations=2, prefix=prefix,
                                   generator=torch.Generator().manual_seed(1), **kw)
    hook.remove()
    assert seen == [(2, 6), (3, 5)]  # U·P prefix tokens, then n·S: each prefix prefilled once
    ref = sample_completions(lm, *per_row(*whole, 2), generator=torch.Generator().manual_seed(1), **kw)
    assert_same_completions(fast, ref)
    assert prefix.rows(1, 3).index.tolist() == [1, 0] and prefix.rows(1, 2).embeds.shape[0] == 1


@pytest.mark.parametrize("plan", [{}, dict(fuse_layers=True, pad_head=True, split_prompt_cache=True)])
def test_no_host_wait_between_the_prefill_and_the_decode_loop(monkeypatch, plan):
    """Once the prefill is queued the host must not wait for the device until the loop's stop checks: on CUDA it
    warms up and records the step's graph while the prefill still runs. A host list copied to the device (the stop
    ids) used to block there, leaving the GPU idle for the warm-up's and the capture's launches."""
    from projects.llava_sam2.rl_train.benchmarks.host_syncs import HostSyncCounter
    from projects.llava_sam2.rl_train.model.decoding import fast_generation

    phase, queued = ["call start"], fast_generation.prefill

    def prefill(*args, **kwargs):
        out = queued(*args, **kwargs)
        phase[0] = "prefill queued"
        return out

    monkeypatch.setattr(fast_generation, "prefill", prefill)
    lm = tiny_lm()
    embeds, attention = prompts(lm, [5, 9, 7])
    with HostSyncCounter(phase=lambda: phase[0]) as syncs:
        fast_sample_completions(lm, embeds, attention, num_generations=2, max_new_tokens=9, stop_token_ids=[NEVER],
                                stop_check_interval=4, generator=torch.Generator().manual_seed(0), **plan)
    after = sorted({(kind, place.rsplit(" ", 1)[1]) for p, kind, place in syncs.counts if p == "prefill queued"})
    assert after == [("bool", "fast_sample_completions"), ("int", "_completions")], syncs.table()
    assert syncs.total(phase="prefill queued", where="fast_sample_completions") == 2  # steps 4 and 8


def test_compiled_choice_draws_the_eager_tokens_and_compiles_once(monkeypatch):
    """With compile_step (top-p off) the token choice runs compiled (fast_decode_step.compiled_record_choice): the
    same draws from the same generator as the eager choice, and one trace for calls of other rows and lengths."""
    from projects.llava_sam2.rl_train.model.decoding import fast_decode_step

    choice_graphs = []

    def counting_backend(graph_module, example_inputs):
        inputs = [node.name for node in graph_module.graph.nodes if node.op == "placeholder"]
        if any("noise" in name for name in inputs):
            choice_graphs.append(graph_module)
        return graph_module.forward

    monkeypatch.setattr(fast_decode_step, "COMPILE_BACKEND", counting_backend)
    torch.compiler.reset()
    try:
        lm = tiny_lm()
        for lengths, G, T in (([5, 9, 7], 2, 6), ([4, 60], 3, 9)):
            embeds, attention = prompts(lm, lengths)
            kw = dict(num_generations=G, max_new_tokens=T, temperature=0.8, stop_token_ids=[NEVER])
            eager = fast_sample_completions(lm, embeds, attention, generator=torch.Generator().manual_seed(4), **kw)
            compiled = fast_sample_completions(lm, embeds, attention, compile_step=True,
                                               generator=torch.Generator().manual_seed(4), **kw)
            assert_same_completions(compiled, eager)
        assert len(choice_graphs) == 1
    finally:
        torch.compiler.reset()


def test_compiled_prefill_runs_the_grouped_prompt_pass_with_the_lms_values(monkeypatch):
    """With a layer backend the prefill runs grouped_scoring's prompt pass, each layer call compiled: the last state
    and every layer's keys/values at the real tokens equal the LM's own forward's (fp32, aot_eager), and a decode of
    shared-prefix prompts on it draws the reference's tokens."""
    from projects.llava_sam2.rl_train.model.decoding import fast_decode_step, fast_generation
    from projects.llava_sam2.rl_train.model.decoding.generation import SharedPrefix
    from projects.llava_sam2.rl_train.model.network.transformers_seams import cache_tensors

    lm = tiny_lm()
    embeds, attention = prompts(lm, [5, 9, 7])
    parts = fast_decode_step.DecoderParts.of(lm)
    passes, grouped = [], fast_generation.branched_hidden
    monkeypatch.setattr(fast_generation, "branched_hidden",
                        lambda *args, **kwargs: passes.append(kwargs["layer_backend"]) or grouped(*args, **kwargs))
    torch.compiler.reset()
    try:
        with torch.no_grad():
            want_hidden, want_cache = fast_generation.prefill(parts, embeds, attention)
            hidden, cache = fast_generation.prefill(parts, embeds, attention, lm=lm, layer_backend="aot_eager")
        torch.testing.assert_close(hidden, want_hidden, atol=1e-5, rtol=0)
        real = attention.bool()[:, None, :, None]  # [B, 1, L, 1]: pad slots are never read
        for got, want in zip(cache_tensors(cache), cache_tensors(want_cache), strict=True):
            for g, w in zip(got, want):
                torch.testing.assert_close(g * real, w * real, atol=1e-5, rtol=0)

        monkeypatch.setattr(fast_decode_step, "COMPILE_BACKEND", "aot_eager")
        kw = dict(max_new_tokens=5, temperature=0.9, stop_token_ids=[NEVER])
        heads = left_padded_embeds(lm, [torch.arange(1, 7), torch.arange(3, 7)])
        prefix = SharedPrefix(*heads, torch.tensor([0, 1, 0]))
        rest = left_padded_embeds(lm, [torch.arange(8, 11), torch.arange(20, 25), torch.arange(30, 32)])
        fast = fast_sample_completions(lm, *rest, num_generations=2, prefix=prefix, compile_step=True,
                                       generator=torch.Generator().manual_seed(2), **kw)
        ref = sample_completions(lm, *per_row(*prefix.full_prompts(*rest), 2),
                                 generator=torch.Generator().manual_seed(2), **kw)
        assert_same_completions(fast, ref)
        assert passes == ["aot_eager"] * 2  # the direct prefill, the shared prefixes' (plain prompts: the tests of
        # compile_step, e.g. test_compiled_step_equals_the_reference, decode on this prefill)
    finally:
        torch.compiler.reset()
