"""model/decoding/adapter_merge.py: decoding from merged scratch copies of the LoRA-adapted weights gives the adapter path's
completions (fp32: same tokens, log-probs within 1e-5), runs no adapter kernel, and leaves every live tensor
bit-identical; layers whose forward a merge would change (adapter disabled, dropout active) keep their own."""
from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpo_tiny import one_thread
from projects.llava_sam2.rl_train.model.decoding import fast_decode_step
from projects.llava_sam2.rl_train.model.decoding.adapter_merge import MERGED_WEIGHT, merged_adapters
from projects.llava_sam2.rl_train.model.decoding.fast_generation import (DECODE_BACKENDS, fast_merged_completions,
                                                                fast_sample_completions)
from projects.llava_sam2.rl_train.model.network.lora import apply_lora

_one_thread = pytest.fixture(autouse=True)(one_thread)

VOCAB, NEVER = 96, 97


def lora_lm(dropout: float = 0.0):
    torch.manual_seed(0)
    lm = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      initializer_range=0.2))
    lm = apply_lora(lm, r=4, lora_alpha=8, lora_dropout=dropout).eval()
    with torch.no_grad():  # a non-zero B, so the adapters change the policy
        for name, param in lm.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.3)
    return lm


def prompts(lm, lengths=(5, 9, 7)):
    g = torch.Generator().manual_seed(1)
    L = max(lengths)
    ids = torch.zeros(len(lengths), L, dtype=torch.long)
    attention = torch.zeros(len(lengths), L, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, L - n:], attention[row, L - n:] = torch.randint(1, VOCAB, (n,), generator=g), 1
    with torch.no_grad():
        return lm.get_input_embeddings()(ids), attention


def snapshot(lm):
    return {name: t.detach().clone() for name, t in [*lm.named_parameters(), *lm.named_buffers()]}


def assert_bit_identical(lm, before):
    now = dict([*lm.named_parameters(), *lm.named_buffers()])
    assert now.keys() == before.keys()
    for name, value in before.items():
        assert torch.equal(now[name], value), f"{name} changed"


def assert_restored(lm):
    assert not any(type(m).__name__.startswith("Merged") or MERGED_WEIGHT in vars(m) for m in lm.modules())


def count_adapter_calls(lm) -> list[int]:
    calls = [0]
    for name, module in lm.named_modules():
        if name.endswith("lora_A.default"):
            module.register_forward_pre_hook(lambda m, args: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("do_sample", [False, True])
def test_merged_decode_equals_the_adapter_path_and_leaves_the_weights_bit_identical(do_sample):
    lm = lora_lm()
    embeds, attention = prompts(lm)
    kw = dict(num_generations=2, max_new_tokens=8, do_sample=do_sample, temperature=0.8, stop_token_ids=[NEVER])
    before = snapshot(lm)
    calls = count_adapter_calls(lm)
    merged = fast_merged_completions(lm, embeds, attention, generator=torch.Generator().manual_seed(3), **kw)
    assert calls[0] == 0  # no adapter kernel ran: every adapted linear used its merged weight
    assert_bit_identical(lm, before)
    assert_restored(lm)
    adapters = fast_sample_completions(lm, embeds, attention, generator=torch.Generator().manual_seed(3), **kw)
    assert calls[0] > 0
    assert torch.equal(merged.ids, adapters.ids) and torch.equal(merged.completion_mask, adapters.completion_mask)
    torch.testing.assert_close(merged.token_logp, adapters.token_logp, atol=1e-5, rtol=0)
    with torch.no_grad(), lm.disable_adapter():
        base = fast_sample_completions(lm, embeds, attention, generator=torch.Generator().manual_seed(3), **kw)
    assert not torch.equal(base.ids, merged.ids)  # the merge carried the adapters
    assert DECODE_BACKENDS["fast"] is fast_merged_completions and DECODE_BACKENDS["fast_adapters"] is \
        fast_sample_completions


def test_each_call_merges_the_weights_in_effect():
    """Weight sets swap by in-place copy between calls: the next merge sees the new adapter values."""
    lm = lora_lm()
    embeds, attention = prompts(lm)
    kw = dict(num_generations=1, max_new_tokens=6, do_sample=False, stop_token_ids=[NEVER])
    first = fast_merged_completions(lm, embeds, attention, **kw)
    with torch.no_grad():
        for name, param in lm.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn_like(param) * 0.5)
    second = fast_merged_completions(lm, embeds, attention, **kw)
    assert not torch.equal(first.ids, second.ids)
    assert torch.equal(second.ids, fast_sample_completions(lm, embeds, attention, **kw).ids)


def test_disabled_adapters_and_active_dropout_keep_their_own_forward_and_errors_restore():
    lm = lora_lm(dropout=0.3)
    with lm.disable_adapter(), merged_adapters(lm) as merged:  # the reference policy: nothing to merge
        assert merged == 0
    lm.train()  # dropout active: a merge would drop the noise, so the layers stay as they are
    with merged_adapters(lm) as merged:
        assert merged == 0
    lm.eval()
    before = snapshot(lm)
    with pytest.raises(RuntimeError, match="inside the block"):
        with merged_adapters(lm) as merged:
            assert merged == 2 * 7 and all(MERGED_WEIGHT in vars(m) for m in lm.modules() if "Merged" in type(m).__name__)
            raise RuntimeError("failed inside the block")
    assert_restored(lm)
    assert_bit_identical(lm, before)


def test_compiled_step_on_merged_weights_compiles_once(monkeypatch):
    """The merged layers switch to one cached class, so new scratch weights on the next call need no recompile."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(fast_decode_step, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    lm = lora_lm()
    embeds, attention = prompts(lm)
    kw = dict(num_generations=2, max_new_tokens=5, do_sample=False, stop_token_ids=[NEVER])
    first = fast_merged_completions(lm, embeds, attention, compile_step=True, **kw)
    graphs = counters["stats"]["unique_graphs"]
    second = fast_merged_completions(lm, embeds, attention, compile_step=True, **kw)
    assert counters["stats"]["unique_graphs"] == graphs and torch.equal(first.ids, second.ids)
    assert torch.equal(first.ids, fast_sample_completions(lm, embeds, attention, **kw).ids)


def test_merged_weight_is_summed_in_fp32_inside_a_rollouts_autocast():
    """GRPOLoop runs the rollout under the AMP autocast (engine/loop.py); the merge must not round B A to bf16."""
    lm = lora_lm().to(torch.bfloat16)
    for name, p in lm.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()  # peft's layout on a bf16 model: fp32 adapters
    with merged_adapters(lm):
        plain = {n: getattr(m, MERGED_WEIGHT).clone() for n, m in lm.named_modules() if hasattr(m, MERGED_WEIGHT)}
    with torch.autocast("cpu", dtype=torch.bfloat16), merged_adapters(lm):
        amp = {n: getattr(m, MERGED_WEIGHT) for n, m in lm.named_modules() if hasattr(m, MERGED_WEIGHT)}
        assert plain.keys() == amp.keys() and plain
        assert all(torch.equal(plain[n], amp[n]) for n in plain)


def autocast_seen(lm) -> list[bool]:
    seen = []
    lm.base_model.model.model.layers[0].mlp.register_forward_pre_hook(
        lambda m, args: seen.append(torch.is_autocast_enabled("cpu")))
    return seen


def test_merged_decode_leaves_the_rollouts_autocast_when_no_adapter_computes():
    """Every adapter merged: the decode under a rollout's autocast is the decode without it, bit for bit; with an
    adapter still computing (active dropout) autocast stays on."""
    lm = lora_lm()
    embeds, attention = prompts(lm)
    kw = dict(num_generations=2, max_new_tokens=6, do_sample=True, temperature=0.8, stop_token_ids=[NEVER])
    plain = fast_merged_completions(lm, embeds, attention, generator=torch.Generator().manual_seed(3), **kw)
    seen = autocast_seen(lm)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        amp = fast_merged_completions(lm, embeds, attention, generator=torch.Generator().manual_seed(3), **kw)
        assert torch.is_autocast_enabled("cpu")  # restored after the call
    assert seen and not any(seen)
    assert torch.equal(plain.ids, amp.ids) and torch.equal(plain.token_logp, amp.token_logp)
    dropout = lora_lm(dropout=0.3).train()
    seen = autocast_seen(dropout)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast_merged_completions(dropout, embeds, attention, generator=torch.Generator().manual_seed(3), **kw)
    assert seen and all(seen)
