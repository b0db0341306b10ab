"""model/decoding/prefix_attention.py's Triton kernels, run by Triton's CPU interpreter.

Not collected by the suite's file pattern: ``tests/test_prefix_attention.py`` runs this file in a subprocess with
``TRITON_INTERPRET=1`` (Triton reads it when it is imported, so it cannot be switched on inside a test process).
"""
import pytest
import torch
import torch.nn.functional as F

from projects.llava_sam2.rl_train.model.decoding import decode_plan, prefix_attention
from projects.llava_sam2.rl_train.model.decoding.prefix_attention import shared_prefix_decode_attention
from test_decode_plan import ALL_SWITCHES, NEVER, assert_same_completions, fast, prompts, reference, tiny_lm
from test_decode_plan import test_split_prompt_cache_shares_grouped_prefixes_once as grouped_prefix_decode

NEG = torch.finfo(torch.float32).min


def test_runs_in_the_interpreter():
    assert prefix_attention.interpreted()


def full_cache_attention(query, prefix_key, prefix_value, prefix_bias, tail_key, tail_value, tail_bias, visible_tail,
                         scale):
    """The same attention on full rows (each prompt's slots copied to its G rows), by SDPA (all tail slots read)."""
    G = query.shape[0] // prefix_key.shape[0]
    keys = torch.cat([prefix_key.repeat_interleave(G, 0), tail_key], 2)
    values = torch.cat([prefix_value.repeat_interleave(G, 0), tail_value], 2)
    bias = torch.cat([prefix_bias.repeat_interleave(G, 0), tail_bias], 1)[:, None, None]  # [N, 1, 1, S]
    return F.scaled_dot_product_attention(query[:, :, None], keys, values, attn_mask=bias, scale=scale,
                                          enable_gqa=True)[:, :, 0]


@pytest.mark.parametrize("B, G, Hkv, R, L, T, hd", [(2, 3, 2, 4, 150, 70, 16), (3, 1, 1, 2, 40, 5, 8),
                                                     (1, 8, 2, 8, 300, 130, 32)])
def test_kernels_equal_full_cache_attention(B, G, Hkv, R, L, T, hd):
    """Left-padded prompts (one padded past a whole split), tails visible up to a per-row step (the bound: the last
    visible slot + 1), fp32: equal to SDPA on the full rows within float rounding; B·Hkv·splits programs cover the
    prompt however L falls on the splits."""
    g = torch.Generator().manual_seed(B * 100 + L)
    N, H = B * G, Hkv * R
    query = torch.randn(N, H + Hkv, hd, generator=g)[:, :H]  # a strided view, as the fused q|k rows are
    prefix_key, prefix_value = (torch.randn(B, Hkv, L, hd, generator=g) for _ in range(2))
    tail_key, tail_value = (torch.randn(N, Hkv, T, hd, generator=g) for _ in range(2))
    prefix_bias = torch.zeros(B, L)
    prefix_bias[0, : L // 2] = NEG  # half of prompt 0 is left padding: whole splits see no visible key
    tail_bias = torch.full((N, T), NEG)
    visible = [1 + (3 * n) % T for n in range(N)]
    for n in range(N):
        tail_bias[n, : visible[n]] = 0.0
    args = (query, prefix_key, prefix_value, prefix_bias, tail_key, tail_value, tail_bias,
            torch.tensor([max(visible)]), hd ** -0.5)
    got = shared_prefix_decode_attention(*args)
    torch.testing.assert_close(got, full_cache_attention(*args), atol=2e-6, rtol=0)
    blocks_per_split, splits, most = prefix_attention.prompt_splits(L, B * Hkv, query.device)
    assert splits <= most and (splits - 1) * blocks_per_split * prefix_attention.BLOCK_KEYS < L \
        <= splits * blocks_per_split * prefix_attention.BLOCK_KEYS
    assert blocks_per_split & (blocks_per_split - 1) == 0  # a power of 2: few kernel compiles over a run's lengths


def test_tail_blocks_past_the_visible_bound_are_not_read():
    """Tail blocks that start at or past the bound hold NaN (slots the bias hides too, as unwritten cache slots may
    hold anything): the output is SDPA's on the rows without them, finite. A kernel that reads those blocks returns
    NaN (a hidden score's weight is 0, but 0 · NaN is NaN)."""
    g = torch.Generator().manual_seed(7)
    B, G, Hkv, R, L, T, hd, visible = 2, 2, 1, 2, 40, 150, 8, 70  # tail blocks [0, 64) [64, 128) [128, 150)
    N, H = B * G, Hkv * R
    query = torch.randn(N, H, hd, generator=g)
    prefix_key, prefix_value = (torch.randn(B, Hkv, L, hd, generator=g) for _ in range(2))
    tail_key, tail_value = (torch.randn(N, Hkv, T, hd, generator=g) for _ in range(2))
    prefix_bias = torch.zeros(B, L)
    tail_bias = torch.full((N, T), NEG)
    tail_bias[:, :visible] = 0.0
    tail_bias[0, 5:] = NEG  # a row behind the others: its hidden slots inside visited blocks stay masked by the bias
    skipped = -(-visible // prefix_attention.BLOCK_KEYS) * prefix_attention.BLOCK_KEYS  # 128: first unread slot
    tail_key[:, :, skipped:] = float("nan")
    tail_value[:, :, skipped:] = float("nan")
    got = shared_prefix_decode_attention(query, prefix_key, prefix_value, prefix_bias, tail_key, tail_value,
                                         tail_bias, torch.tensor([visible]), hd ** -0.5)
    expected = full_cache_attention(query, prefix_key, prefix_value, prefix_bias, tail_key[:, :, :skipped],
                                    tail_value[:, :, :skipped], tail_bias[:, :skipped], None, hd ** -0.5)
    assert expected.isfinite().all()
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=0)


def test_split_cache_decodes_the_reference_tokens_through_the_kernels(monkeypatch):
    """A seeded decode with the split cache takes the kernel path (counted) and gives the reference decoder's tokens
    and token_logp (kept short: the interpreter runs every program in Python)."""
    calls = []
    kernel = decode_plan.shared_prefix_decode_attention
    monkeypatch.setattr(decode_plan, "shared_prefix_decode_attention", lambda *a: calls.append(1) or kernel(*a))
    lm = tiny_lm()
    embeds, attention = prompts(lm, [5, 9])
    kw = dict(max_new_tokens=4, temperature=0.8, stop_token_ids=[NEVER])
    got = fast(lm, embeds, attention, 3, 4, split_prompt_cache=True, **ALL_SWITCHES, **kw)
    assert_same_completions(got, reference(lm, embeds, attention, 3, 4, **kw))
    assert len(calls) == 3 * len(lm.model.layers)  # steps 1..3 (step 0 is the prefill's), every layer


def test_grouped_prefixes_decode_the_reference_tokens_through_the_kernels(monkeypatch):
    """Shared image prefixes with each row's own tokens in the tail (test_decode_plan's check, shorter)."""
    grouped_prefix_decode(monkeypatch, generations=(2,), max_new_tokens=3)
