"""model/decoding/generation.py on a tiny random Qwen2ForCausalLM (no Sa2VA parts needed)."""
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from projects.llava_sam2.rl_train.model.decoding.generation import (
    Completions, completion_hidden, completion_logprobs, position_ids_from_attention, sample_completions)

VOCAB, D = 96, 32


def tiny_lm(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=D, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        initializer_range=0.2,  # peaked logits: greedy argmax is not decided by float noise
    )
    return Qwen2ForCausalLM(cfg).eval()


def left_padded_prompts(lm, lengths, seed=1):
    """Random token prompts, embedded and LEFT padded: (embeds [N, L, D], attention [N, L], rows)."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(1, VOCAB, (n,), generator=g) for n in lengths]
    L = max(lengths)
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    attention = torch.zeros(len(rows), L, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, L - len(r):] = r
        attention[i, L - len(r):] = 1
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids)
    return embeds, attention, rows


def test_position_ids_clamp_left_padding():
    attention = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert position_ids_from_attention(attention).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]


def test_greedy_matches_hf_generate():
    lm = tiny_lm()
    embeds, attention, _ = left_padded_prompts(lm, [5, 9, 7, 3])
    free = lm.generate(inputs_embeds=embeds, attention_mask=attention, max_new_tokens=10,
                       do_sample=False, pad_token_id=0, eos_token_id=None)
    stop_id = int(free[0, 3])  # a token row 0 really emits, so at least one row stops early
    ref = lm.generate(inputs_embeds=embeds, attention_mask=attention, max_new_tokens=10,
                      do_sample=False, pad_token_id=0, eos_token_id=[stop_id])
    out = sample_completions(lm, embeds, attention, max_new_tokens=10, do_sample=False,
                             stop_token_ids=[stop_id], pad_token_id=0)
    assert isinstance(out, Completions)
    assert out.ids.shape == ref.shape  # HF also stops once every row is done
    assert torch.equal(out.ids, ref)
    assert bool(out.completion_mask[0, 3]) and not bool(out.completion_mask[0, 4:].any())


def test_sampled_logprobs_match_recompute_and_seed_repeats():
    lm = tiny_lm()
    embeds, attention, _ = left_padded_prompts(lm, [4, 8, 6, 6, 2, 7])
    kw = dict(max_new_tokens=12, temperature=0.7, top_p=1.0, do_sample=True, stop_token_ids=[5])
    a = sample_completions(lm, embeds, attention, generator=torch.Generator().manual_seed(3), **kw)
    b = sample_completions(lm, embeds, attention, generator=torch.Generator().manual_seed(3), **kw)
    assert torch.equal(a.ids, b.ids)
    with torch.no_grad():
        recomputed = completion_logprobs(lm, embeds, attention, a.ids, a.completion_mask, temperature=0.7)
    assert a.completion_mask.sum() > 20
    torch.testing.assert_close(recomputed, a.token_logp, atol=1e-5, rtol=0)
    assert bool((recomputed[a.completion_mask] < 0).all())
    assert bool((recomputed[~a.completion_mask] == 0).all())


def test_top_p_keeps_draws_inside_the_nucleus():
    lm = tiny_lm()
    embeds, attention, _ = left_padded_prompts(lm, [6, 6, 6, 6])
    out = sample_completions(lm, embeds, attention, max_new_tokens=1, top_p=0.3, stop_token_ids=[0],
                             generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logp = lm(inputs_embeds=embeds, attention_mask=attention,
                  position_ids=position_ids_from_attention(attention)).logits[:, -1].log_softmax(-1)
    sorted_p, order = logp.exp().sort(-1, descending=True)
    rank = (order == out.ids[:, :1]).float().argmax(-1)  # [N] rank of the drawn token
    mass_before = torch.stack([sorted_p[i, :r].sum() for i, r in enumerate(rank.tolist())])
    assert bool((mass_before < 0.3 + 1e-6).all())  # the draw is inside the 0.3 nucleus


def test_left_padding_does_not_change_a_row():
    lm = tiny_lm()
    embeds, attention, rows = left_padded_prompts(lm, [3, 10, 6])
    batched = sample_completions(lm, embeds, attention, max_new_tokens=8, do_sample=False,
                                 stop_token_ids=[VOCAB + 1])
    with torch.no_grad():
        batched_logp = completion_logprobs(lm, embeds, attention, batched.ids, batched.completion_mask)
    for i, r in enumerate(rows):
        with torch.no_grad():
            e = lm.get_input_embeddings()(r[None])
        alone = sample_completions(lm, e, torch.ones(1, len(r), dtype=torch.long), max_new_tokens=8,
                                   do_sample=False, stop_token_ids=[VOCAB + 1])
        assert torch.equal(alone.ids[0], batched.ids[i]), f"row {i} changed under left padding"
        with torch.no_grad():
            alone_logp = completion_logprobs(lm, e, torch.ones(1, len(r)), alone.ids, alone.completion_mask)
        torch.testing.assert_close(alone_logp[0], batched_logp[i], atol=1e-5, rtol=0)


def test_stop_tokens_end_rows_and_truncation_flags():
    lm = tiny_lm()
    embeds, attention, _ = left_padded_prompts(lm, [5, 9, 7, 3])
    free = sample_completions(lm, embeds, attention, max_new_tokens=6, do_sample=False, stop_token_ids=[VOCAB + 1])
    assert free.is_truncated.all() and free.completion_mask.all() and free.ids.shape == (4, 6)
    stop_id = int(free.ids[1, 2])
    out = sample_completions(lm, embeds, attention, max_new_tokens=6, do_sample=False,
                             stop_token_ids=[stop_id], pad_token_id=0, stop_check_interval=1)
    for i in range(4):
        row = free.ids[i].tolist()
        if stop_id in row:
            k = row.index(stop_id)
            assert not out.is_truncated[i]
            assert out.completion_mask[i].tolist()[:k + 1] == [True] * (k + 1)
            assert not out.completion_mask[i, k + 1:].any()
            assert (out.ids[i, k + 1:] == 0).all()
        else:
            assert out.is_truncated[i] and out.completion_mask[i].all()
    assert out.ids.shape[1] == int(out.completion_mask.sum(-1).max())


def test_logits_and_hidden_offsets_match_a_plain_hf_forward():
    lm = tiny_lm()
    embeds, attention, _ = left_padded_prompts(lm, [4, 7])
    L = embeds.shape[1]
    ids = torch.tensor([[11, 12, 13, 14], [21, 22, 0, 0]])
    completion_mask = torch.tensor([[True] * 4, [True, True, False, False]])
    with torch.no_grad():
        token_logp, hidden = completion_logprobs(lm, embeds, attention, ids, completion_mask, return_hidden=True)
        full_attention = torch.cat([attention, completion_mask.long()], 1)
        out = lm(inputs_embeds=torch.cat([embeds, lm.get_input_embeddings()(ids)], 1),
                 attention_mask=full_attention, position_ids=position_ids_from_attention(full_attention),
                 output_hidden_states=True)
    logp = out.logits.log_softmax(-1)
    for i in range(2):
        for t in range(int(completion_mask[i].sum())):
            # token t is scored by position L-1+t; its hidden state is the one at position L+t
            torch.testing.assert_close(token_logp[i, t], logp[i, L - 1 + t, ids[i, t]], atol=1e-5, rtol=0)
            torch.testing.assert_close(hidden[i, t], out.hidden_states[-1][i, L + t], atol=1e-5, rtol=0)
    assert hidden.shape == (2, 4, D)
    assert not torch.allclose(hidden[0, 0], out.hidden_states[-1][0, L - 1])


@pytest.mark.parametrize("positions", [1, 3])
def test_vocabulary_chunks_equal_the_unchunked_pass_with_gradients(positions):
    """max_logit_bytes = N*V*4*t: the head sees t positions per call, forward and checkpointed backward, and the
    log-probs and gradients equal the all-at-once pass (up to the head matmul's row-count rounding)."""
    lm = tiny_lm()
    lm.lm_head.weight.requires_grad_(True)
    embeds, attention, _ = left_padded_prompts(lm, [4, 7, 5])
    ids = torch.randint(1, VOCAB, (3, 8), generator=torch.Generator().manual_seed(0))
    completion_mask = torch.arange(8)[None] < torch.tensor([8, 3, 6])[:, None]
    seen = []
    lm.lm_head.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))
    results = []
    for budget in (None, 3 * VOCAB * 4 * positions):
        x = embeds.clone().requires_grad_(True)
        lm.zero_grad()
        logp = completion_logprobs(lm, x, attention, ids, completion_mask, temperature=0.7, max_logit_bytes=budget)
        (logp * torch.linspace(-1, 1, 8)).sum().backward()
        results.append((logp.detach(), x.grad, lm.lm_head.weight.grad.clone()))
    assert seen[0] == 8 and max(seen[1:]) == positions and len(seen) == 1 + 2 * -(-8 // positions)
    (full, full_dx, full_dw), (chunked, chunked_dx, chunked_dw) = results
    assert full_dx.abs().sum() > 0 and full_dw.abs().sum() > 0
    torch.testing.assert_close(chunked, full, atol=2e-6, rtol=0)
    torch.testing.assert_close(chunked_dx, full_dx, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(chunked_dw, full_dw, atol=2e-6, rtol=1e-5)
    with torch.no_grad():
        _, hidden = completion_logprobs(lm, embeds, attention, ids, completion_mask, return_hidden=True)
        assert torch.equal(completion_hidden(lm, embeds, attention, ids, completion_mask), hidden)


def test_bad_inputs_are_rejected():
    lm = tiny_lm()
    embeds, attention, _ = left_padded_prompts(lm, [3, 6])
    with pytest.raises(ValueError, match="left padded"):
        sample_completions(lm, embeds, attention.flip(-1), max_new_tokens=2, stop_token_ids=[1])
    with pytest.raises(ValueError, match="stop_token_ids"):
        sample_completions(lm, embeds, attention, max_new_tokens=2, stop_token_ids=[])
    with pytest.raises(ValueError, match="completion_ids"):
        completion_logprobs(lm, embeds, attention, torch.zeros(3, 2, dtype=torch.long),
                            torch.ones(3, 2, dtype=torch.bool))


def test_checkpointing_in_train_mode_drops_the_cache_and_is_refused_and_eval_mode_decodes():
    lm = tiny_lm()
    embeds, attention, _ = left_padded_prompts(lm, [4, 7])
    kw = dict(max_new_tokens=5, do_sample=False, stop_token_ids=[VOCAB + 1])
    reference = sample_completions(lm, embeds, attention, **kw)
    lm.gradient_checkpointing_enable()
    lm.train()  # transformers >= 4.56: each checkpointed decoder layer drops the cache it is passed
    with pytest.raises(RuntimeError, match="lm.eval"):
        sample_completions(lm, embeds, attention, **kw)
    lm.eval()  # checkpointing stays enabled; it applies in train mode only
    assert torch.equal(sample_completions(lm, embeds, attention, **kw).ids, reference.ids)

    class CachelessLM(torch.nn.Module):
        """An LM whose body ignores past_key_values (what some remote-code LMs do under checkpointing)."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def get_decoder(self):
            return lambda past_key_values=None, **kwargs: self.inner.get_decoder()(**kwargs)

        def get_output_embeddings(self):
            return self.inner.get_output_embeddings()

        def get_input_embeddings(self):
            return self.inner.get_input_embeddings()

    with pytest.raises(RuntimeError, match="lm.eval"):
        sample_completions(CachelessLM(lm), embeds, attention, **kw)
