"""model/decoding/head_logprob.py (``logprob_head='fused'``) against the reference head (``'reference'``), fp32 on CPU.

Tolerance 1e-5 (abs and rel) on log-probs and gradients: both paths run the same per-row arithmetic; only the GEMM's
row blocking (M real rows against N·T positions, 1,152 padded against 1,151 head rows) and the order of the softmax
gradient's sums differ, which moves fp32 values by a few ulps (measured below 1e-6 on these sizes). A wrong token, a
one-position shift or a padded vocabulary column in the softmax moves them by 1e-4 or more (the second test).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from grpo_tiny import build_tiny, make_algo, one_thread, run_rollout, shapes_batch
from projects.llava_sam2.rl_train.grpo.config import GRPOConfig
from projects.llava_sam2.rl_train.grpo.cycle import caption_logp
from projects.llava_sam2.rl_train.model.decoding import head_logprob
from projects.llava_sam2.rl_train.model.decoding.generation import LOGPROB_HEADS, completion_logprobs
from projects.llava_sam2.rl_train.model.decoding.head_logprob import fused_token_logprobs, padded_rows

_one_thread = pytest.fixture(autouse=True)(one_thread)

TOL = dict(atol=1e-5, rtol=1e-5)
VOCAB, D = 1151, 24  # the tiny tokenizer's vocabulary: not a multiple of 64, so the fused path pads it to 1,152


def head_batch(seed=0, N=4, T=6, train_head=False):
    """A bias-free head [V, D], states [N, T, D] (leaf, grad), token ids and a right-padded mask (rows of 1..T)."""
    g = torch.Generator().manual_seed(seed)
    head = nn.Linear(D, VOCAB, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(VOCAB, D, generator=g))
    head.weight.requires_grad_(train_head)
    hidden = torch.randn(N, T, D, generator=g).requires_grad_(True)
    ids = torch.randint(0, VOCAB, (N, T), generator=g)
    completion_mask = torch.arange(T)[None] < torch.tensor([T, 1, 4, 3][:N])[:, None]
    return head, hidden, ids, completion_mask


def scored(name, head, hidden, ids, completion_mask, weights, **kwargs):
    """token_logp of LOGPROB_HEADS[name] and the gradients of sum(weights * token_logp) (states, head weight)."""
    hidden.grad, head.weight.grad = None, None
    token_logp = LOGPROB_HEADS[name](head, hidden, ids, completion_mask, **kwargs)
    (weights * token_logp).sum().backward()
    weight_grad = None if head.weight.grad is None else head.weight.grad.clone()
    return token_logp.detach(), hidden.grad.clone(), weight_grad


@pytest.mark.parametrize("train_head", [False, True], ids=["frozen_head", "trained_head"])
@pytest.mark.parametrize("temperature,max_logit_bytes", [(1.0, None), (0.7, VOCAB * 4 * 3)])
def test_fused_head_equals_the_reference_head_on_values_and_gradients(train_head, temperature, max_logit_bytes):
    """Frozen head: the gradient w.r.t. the states comes from the forward; trained head: the backward recomputes.
    Chunks of 3 rows (max_logit_bytes) cover a chunk boundary inside a sequence."""
    head, hidden, ids, completion_mask = head_batch(train_head=train_head)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    kwargs = dict(temperature=temperature, max_logit_bytes=max_logit_bytes)
    ref = scored("reference", head, hidden, ids, completion_mask, weights, **kwargs)
    new = scored("fused", head, hidden, ids, completion_mask, weights, **kwargs)
    torch.testing.assert_close(new[0], ref[0], **TOL)
    torch.testing.assert_close(new[1], ref[1], **TOL)
    assert bool((new[0][~completion_mask] == 0).all()) and bool((new[0][completion_mask] < 0).all())
    assert new[1][completion_mask].abs().sum(-1).min() > 0  # every real token's state gets a gradient
    if train_head:
        assert new[2] is not None and new[2].abs().sum() > 0
        torch.testing.assert_close(new[2], ref[2], **TOL)
    else:
        assert new[2] is None and ref[2] is None


def test_the_comparison_catches_a_shifted_token_a_wrong_temperature_and_a_padded_column_in_the_softmax():
    """What the 1e-5 tolerance separates: scoring token t+1 with state t (an off-by-one shift), the default temperature
    instead of the asked one, and the 64-row padding left inside the softmax are all 10x or more outside it. Small
    logits (states x 0.05, logsumexp ~ log V) make the padding's share visible: log(1 + 1/V) ~ 9e-4."""
    head, hidden, ids, completion_mask = head_batch()
    with torch.no_grad():
        hidden.mul_(0.05)
        ref = LOGPROB_HEADS["reference"](head, hidden, ids, completion_mask, temperature=0.7)
        shifted = fused_token_logprobs(head, hidden, ids.roll(-1, dims=1), completion_mask, temperature=0.7)
        default_temperature = fused_token_logprobs(head, hidden, ids, completion_mask)
        zero_rows = padded_rows(head.weight)  # [1152, D], the padding's logits are 0, not -inf
        unsliced = nn.Linear(D, zero_rows.shape[0], bias=False)
        unsliced.weight.copy_(zero_rows)
        padding_in_softmax = fused_token_logprobs(unsliced, hidden, ids, completion_mask, temperature=0.7)
    assert zero_rows.shape == (1152, D) and bool((zero_rows[VOCAB:] == 0).all())
    assert torch.equal(zero_rows[:VOCAB], head.weight) and padded_rows(zero_rows) is zero_rows
    for wrong in (shifted, default_temperature, padding_in_softmax):
        assert (wrong - ref)[completion_mask].abs().min() > 1e-4


@pytest.mark.parametrize("train_head", [False, True], ids=["frozen_head", "trained_head"])
def test_under_bf16_autocast_log_probs_are_bit_equal_and_gradients_within_bf16_rounding(train_head):
    """The GPU training's arithmetic (bf16 autocast, fp32 master weights): both heads run the bf16 GEMM and the fp32
    log-softmax on the same rows, so the log-probs are identical. The gradients differ by where they are rounded to
    bf16 (frozen head: the unit gradient, then times the incoming scalar; reference: the product), within 2^-7 of the
    largest entry (two roundings of 2^-8); a wrong factor such as a missed 1/temperature is 30 % off."""
    head, hidden, ids, completion_mask = head_batch(train_head=train_head)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = scored("reference", head, hidden, ids, completion_mask, weights, temperature=0.7)
        new = scored("fused", head, hidden, ids, completion_mask, weights, temperature=0.7)
    assert torch.equal(new[0], ref[0])
    for new_grad, ref_grad in zip(new[1:], ref[1:]):
        if ref_grad is None:
            assert new_grad is None
            continue
        assert new_grad.dtype == ref_grad.dtype == torch.float32
        assert (new_grad - ref_grad).abs().max() <= 2 ** -7 * ref_grad.abs().max()


def test_masked_tokens_are_never_scored_and_logits_stay_chunk_sized(monkeypatch):
    """Garbage (NaN states, out-of-range ids) at masked positions changes nothing; the head sees only the real
    tokens, at most 3 rows of logits per call; a frozen head's backward recomputes no logits, a trained one's does."""
    rows_seen = []
    scaled_logits = head_logprob._scaled_logits

    def recording(hidden, *args):
        rows_seen.append(hidden.shape[0])
        return scaled_logits(hidden, *args)

    monkeypatch.setattr(head_logprob, "_scaled_logits", recording)
    for train_head in (False, True):
        head, hidden, ids, completion_mask = head_batch(train_head=train_head)
        weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
        kwargs = dict(temperature=0.7, max_logit_bytes=VOCAB * 4 * 3)
        clean = scored("fused", head, hidden, ids, completion_mask, weights, **kwargs)
        with torch.no_grad():
            hidden[~completion_mask] = float("nan")
        rows_seen.clear()
        garbage = scored("fused", head, hidden, ids.masked_fill(~completion_mask, 10 ** 6), completion_mask, weights,
                         **kwargs)
        M = int(completion_mask.sum())
        assert max(rows_seen) <= 3 and sum(rows_seen) == (2 * M if train_head else M)
        assert torch.equal(garbage[0], clean[0]) and torch.equal(garbage[1], clean[1])
        assert bool((garbage[1][~completion_mask] == 0).all())


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_state_at_a_real_token_is_reported_as_the_reference_reports_it(bad):
    """A NaN / inf state at a scored position: the same positions come out non-finite (NaN or -inf, as in the
    reference), the others equal it; the loss and the state gradient are non-finite in both, which is what the
    training's step guard skips a step on."""
    head, hidden, ids, completion_mask = head_batch()
    with torch.no_grad():
        hidden[2, 1, 0] = bad
    weights = torch.ones(ids.shape)
    ref = scored("reference", head, hidden, ids, completion_mask, weights)
    new = scored("fused", head, hidden, ids, completion_mask, weights)
    assert not bool(torch.isfinite(ref[0][2, 1]))
    assert torch.equal(torch.isnan(new[0]), torch.isnan(ref[0])) and torch.equal(torch.isinf(new[0]),
                                                                                   torch.isinf(ref[0]))
    is_finite = torch.isfinite(ref[0])
    torch.testing.assert_close(new[0][is_finite], ref[0][is_finite], **TOL)
    assert not torch.isfinite(new[0].sum()) and not torch.isfinite(ref[0].sum())
    assert not bool(torch.isfinite(new[1]).all()) and not bool(torch.isfinite(ref[1]).all())


def test_bad_heads_and_names_are_rejected():
    head, hidden, ids, completion_mask = head_batch()
    with pytest.raises(TypeError, match="bias-free nn.Linear"):
        fused_token_logprobs(nn.Linear(D, VOCAB), hidden, ids, completion_mask)
    with pytest.raises(ValueError, match="temperature"):
        fused_token_logprobs(head, hidden, ids, completion_mask, temperature=0.0)
    partitioned = nn.Linear(D, VOCAB, bias=False)
    partitioned.weight = nn.Parameter(torch.empty(0))  # what a ZeRO-3 rank holds outside the module's call
    with pytest.raises(ValueError, match="partitioned"):
        fused_token_logprobs(partitioned, hidden, ids, completion_mask)
    with pytest.raises(ValueError, match="logprob_head='chunked' is not one of"):
        GRPOConfig(logprob_head="chunked")
    lm_inputs = torch.randn(1, 2, D), torch.ones(1, 2), ids[:1], completion_mask[:1]
    with pytest.raises(ValueError, match="logprob_head='chunked'"):
        completion_logprobs(nn.Identity(), *lm_inputs, logprob_head="chunked")


@pytest.mark.parametrize("train_head", [False, True], ids=["frozen_head", "trained_head"])
def test_loop1_loss_pass_on_tiny_sa2va_is_the_same_with_the_fused_head(train_head):
    """caption_logp on the tiny Sa2VA (checkpointed LLM in train mode): the fused head's log-probs and the gradient of
    every trainable tensor (LoRA, mlp1, and lm_head when trained) equal the reference head's; the fused no-grad
    rollout scoring (old_logp) equals its own loss pass bit for bit, so the first ratio stays exactly 1."""
    model, processor = build_tiny()
    model.language_model.get_output_embeddings().requires_grad_(train_head)
    algo, _ = make_algo(model, processor, {"mask_to_caption": [dict(type="iou")]}, caption_to_mask_weight=0.0,
                        logprob_head="fused")
    step = run_rollout(algo, shapes_batch(2))
    features, (rollout,) = step.features, step.rollouts
    model.language_model.gradient_checkpointing_enable()
    model.train()
    G, replay, samples, temperature = rollout.group_size, rollout.replay, range(2), 0.7
    g = torch.Generator().manual_seed(0)
    N, T = rollout.action_mask.shape  # random weights never stop a caption: cut the rows at 1..T tokens
    completion_mask = torch.arange(T)[None] < torch.randint(1, T + 1, (N,), generator=g)[:, None]  # [N, T]
    weights = torch.randn(N, T, generator=g)

    def grads_of(logprob_head):
        model.zero_grad(set_to_none=True)
        logp = caption_logp(model, features, model.project_vision(features.vit_tokens), replay, completion_mask,
                            samples, G, temperature, logprob_head)
        (weights * logp).sum().backward()
        return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    new_logp, new_grads = grads_of("fused")
    ref_logp, ref_grads = grads_of("reference")
    assert 8 < completion_mask.sum() < N * T and algo.config.logprob_head == "fused"
    torch.testing.assert_close(new_logp, ref_logp, **TOL)
    assert new_grads.keys() == ref_grads.keys()
    assert any(n.startswith("mlp1") for n in new_grads) and sum("lora_" in n for n in new_grads) == 2 * 2 * 7
    assert any(n.endswith("lm_head.weight") for n in new_grads) == train_head
    for name, grad in new_grads.items():
        assert grad.abs().sum() > 0, f"{name} got no gradient"
        torch.testing.assert_close(grad, ref_grads[name], **TOL, msg=name)
    model.eval()
    with torch.no_grad():
        old_logp = caption_logp(model, features, model.project_vision(features.vit_tokens), replay, completion_mask,
                                samples, G, temperature, "fused")
    assert torch.equal(old_logp, new_logp)


def test_gpu_configs_score_with_the_fused_head_and_cpu_configs_with_the_reference():
    from mmengine.config import Config

    root = Path(__file__).resolve().parents[1] / "projects/llava_sam2/configs/rl"
    head = {name: Config.fromfile(str(root / name)).train_cfg["algorithm"]["config"]["logprob_head"]
            for name in ("sa2va_4b_grpo_cycle.py", "sa2va_in3_8b_grpo_cycle.py", "tiny_grpo_cycle_cpu.py",
                         "demo/grpo_shapes_unpaired_cpu.py")}
    assert head == {"sa2va_4b_grpo_cycle.py": "fused", "sa2va_in3_8b_grpo_cycle.py": "fused",
                    "tiny_grpo_cycle_cpu.py": "reference", "demo/grpo_shapes_unpaired_cpu.py": "reference"}
