"""model/decoding/grouped_scoring.py: the loss pass with each prompt run once for its G completions equals the one-pass
scoring of N repeated rows (fp32, log-probs and the gradient of every trainable tensor), with and without activation
checkpointing; the no-grad rollout scoring is bit-identical to the checkpointed loss pass (first ratio exactly 1)."""
from __future__ import annotations

import pytest
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

from grpo_tiny import build_tiny, make_algo, one_thread, run_rollout, shapes_batch
from projects.llava_sam2.rl_train.grpo.cycle import caption_logp
from projects.llava_sam2.rl_train.model.decoding.generation import completion_logprobs
from projects.llava_sam2.rl_train.model.decoding.grouped_scoring import grouped_completion_logprobs, supports_grouping
from projects.llava_sam2.rl_train.model.network.lora import apply_lora
from projects.llava_sam2.rl_train.model.pipeline.shared import prompt_embeds

_one_thread = pytest.fixture(autouse=True)(one_thread)

VOCAB = 96
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2, pad_token_id=0)
ARCHS = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM),
         "phi3": (Phi3Config, Phi3ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}
ARCH_SIZES = {"qwen3": {"head_dim": 12}}  # Qwen3 names its head size; one that is not hidden / heads (8)
TOL = dict(atol=1e-5, rtol=1e-5)


def lora_lm(arch: str = "qwen2", **overrides):
    """A tiny LM with LoRA (non-zero B, so every LoRA tensor gets a gradient)."""
    torch.manual_seed(0)
    config_cls, lm_cls = ARCHS[arch]
    lm = apply_lora(lm_cls(config_cls(**{**SIZES, **ARCH_SIZES.get(arch, {}), **overrides})), r=4, lora_alpha=8,
                    lora_dropout=0.0)
    with torch.no_grad():
        for name, param in lm.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.3)
    return lm


def group_batch(lengths=(4, 7, 5), G=3, T=6, seed=1):
    """B left-padded prompt id rows and N = B·G right-padded completions: (ids [B, L], attention [B, L], completion
    ids [N, T], completion_mask [N, T] with rows of 1..T tokens)."""
    g = torch.Generator().manual_seed(seed)
    B, L = len(lengths), max(lengths)
    ids = torch.zeros(B, L, dtype=torch.long)
    attention = torch.zeros(B, L, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, L - n:] = torch.randint(1, VOCAB, (n,), generator=g)
        attention[row, L - n:] = 1
    completion_ids = torch.randint(1, VOCAB, (B * G, T), generator=g)
    completion_mask = torch.arange(T)[None] < torch.randint(1, T + 1, (B * G,), generator=g)[:, None]
    completion_mask[0] = True  # one full row
    return ids, attention, completion_ids, completion_mask


def score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, grouped: bool):
    """Log-probs and the gradients of sum(w * logp) w.r.t. the prompt embeddings and every trainable tensor."""
    lm.zero_grad(set_to_none=True)
    x = embeds.detach().clone().requires_grad_(True)
    if grouped:
        logp = grouped_completion_logprobs(lm, x, attention, completion_ids, completion_mask, num_generations=G,
                                           temperature=0.7)
    else:
        logp = completion_logprobs(lm, x.repeat_interleave(G, 0), attention.repeat_interleave(G, 0), completion_ids,
                                   completion_mask, temperature=0.7)
    weights = torch.linspace(-1.0, 1.0, logp.numel()).reshape(logp.shape)
    (weights * logp).sum().backward()
    grads = {name: p.grad.clone() for name, p in lm.named_parameters() if p.requires_grad}
    return logp.detach(), x.grad, grads


@pytest.mark.parametrize("arch, use_checkpointing, T", [
    ("qwen2", False, 1), ("qwen2", False, 6), ("qwen2", True, 1), ("qwen2", True, 6), ("qwen3", True, 6)])
def test_grouped_loss_pass_equals_the_one_pass_with_gradients(arch, use_checkpointing, T):
    lm = lora_lm(arch)
    if use_checkpointing:
        lm.gradient_checkpointing_enable()
    lm.train()
    ids, attention, completion_ids, completion_mask = group_batch(T=T)
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids)
    rows_seen = []
    layer0 = lm.get_decoder().layers[0]
    hook = layer0.register_forward_pre_hook(lambda module, args: rows_seen.append(tuple(args[0].shape[:2])))
    grouped = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, 3, grouped=True)
    hook.remove()
    forward_calls = [(3, 7)] + ([(9, T - 1)] if T > 1 else [])  # B·L prompt tokens, then N·(T-1)
    assert rows_seen == forward_calls * (2 if use_checkpointing else 1)  # backward's recompute starts the same calls
    one_pass = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, 3, grouped=False)
    torch.testing.assert_close(grouped[0], one_pass[0], **TOL)
    torch.testing.assert_close(grouped[1], one_pass[1], **TOL)  # through the prompt, summed over its G rows
    assert grouped[2].keys() == one_pass[2].keys() and len(grouped[2]) == 2 * 7 * 2  # A, B of 7 linears x 2 layers
    for name, grad in grouped[2].items():
        assert grad.abs().sum() > 0, f"{name} got no gradient"
        torch.testing.assert_close(grad, one_pass[2][name], **TOL, msg=name)
    assert bool((grouped[0][~completion_mask] == 0).all()) and bool((grouped[0][completion_mask] < 0).all())


def test_rollout_scoring_is_bit_identical_to_the_checkpointed_loss_pass():
    """old_logp (eval, no grad) and the loss pass (train, grad, checkpointed) run the same arithmetic."""
    lm = lora_lm()
    lm.gradient_checkpointing_enable()
    ids, attention, completion_ids, completion_mask = group_batch()
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids)
        old_logp = grouped_completion_logprobs(lm.eval(), embeds, attention, completion_ids, completion_mask,
                                               num_generations=3)
    lm.train()
    logp = grouped_completion_logprobs(lm, embeds.requires_grad_(True), attention, completion_ids, completion_mask,
                                       num_generations=3)
    assert logp.requires_grad and torch.equal(logp.detach(), old_logp)


@pytest.mark.parametrize("arch", ["llama", "phi3", "qwen3"])
def test_other_architectures_equal_the_one_pass(arch):
    lm = lora_lm(arch).eval()
    ids, attention, completion_ids, completion_mask = group_batch()
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids)
        grouped = grouped_completion_logprobs(lm, embeds, attention, completion_ids, completion_mask, num_generations=3)
        one_pass = completion_logprobs(lm, embeds.repeat_interleave(3, 0), attention.repeat_interleave(3, 0),
                                       completion_ids, completion_mask)
    assert supports_grouping(lm, 13)
    torch.testing.assert_close(grouped, one_pass, **TOL)


def test_a_sliding_window_in_reach_falls_back_to_the_one_pass_and_bad_shapes_are_rejected():
    lm = lora_lm(use_sliding_window=True, sliding_window=4, max_window_layers=0).eval()
    ids, attention, completion_ids, completion_mask = group_batch()
    assert not supports_grouping(lm, 13) and supports_grouping(lora_lm().eval(), 13)
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids)
        grouped = grouped_completion_logprobs(lm, embeds, attention, completion_ids, completion_mask, num_generations=3)
        one_pass = completion_logprobs(lm, embeds.repeat_interleave(3, 0), attention.repeat_interleave(3, 0),
                                       completion_ids, completion_mask)
    assert torch.equal(grouped, one_pass)
    with pytest.raises(ValueError, match=r"\[B\*G, T\] = \[6, T\]"):
        grouped_completion_logprobs(lm, embeds, attention, completion_ids, completion_mask, num_generations=2)
    with pytest.raises(ValueError, match="LEFT padded"):
        grouped_completion_logprobs(lm, embeds, attention.flip(-1), completion_ids, completion_mask, num_generations=3)


def test_loop1_loss_pass_on_tiny_sa2va_equals_the_repeated_prompt_pass():
    """caption_logp (loop 1's action log-prob) on the tiny Sa2VA, checkpointed LLM in train mode: log-probs and the
    gradient of every trainable tensor (LoRA and mlp1, through the image and region tokens) equal the old pass that
    repeated each prompt G times."""
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, {"mask_to_caption": [dict(type="iou")]}, caption_to_mask_weight=0.0)
    step = run_rollout(algo, shapes_batch(2))
    features, (rollout,) = step.features, step.rollouts
    model.language_model.gradient_checkpointing_enable()
    model.train()
    G, replay, samples = rollout.group_size, rollout.replay, range(2)
    weights = torch.randn(rollout.action_mask.shape, generator=torch.Generator().manual_seed(0))

    def grads_of(score):
        model.zero_grad(set_to_none=True)
        logp = score(model.project_vision(features.vit_tokens))
        (weights * logp).sum().backward()
        return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    def repeated_prompt_pass(tiles):
        embeds = prompt_embeds(model, features, tiles, replay.prompt_ids[::G], [features.image_of(s) for s in samples],
                               list(features.region_cells[list(samples)]))
        return completion_logprobs(model.language_model, embeds.repeat_interleave(G, 0), replay.prompt_attention,
                                   replay.completion_ids, rollout.action_mask, temperature=algo.config.temperature)

    new_logp, new_grads = grads_of(lambda tiles: caption_logp(model, features, tiles, replay, rollout.action_mask,
                                                              samples, G, algo.config.temperature, "reference"))
    old_logp, old_grads = grads_of(repeated_prompt_pass)
    assert rollout.action_mask.sum() > 8
    torch.testing.assert_close(new_logp, old_logp, **TOL)
    assert new_grads.keys() == old_grads.keys()
    assert any(n.startswith("mlp1") for n in new_grads) and sum("lora_" in n for n in new_grads) == 2 * 2 * 7
    for name, grad in new_grads.items():
        assert grad.abs().sum() > 0, f"{name} got no gradient"
        torch.testing.assert_close(grad, old_grads[name], **TOL, msg=name)


@pytest.mark.parametrize("use_checkpointing", [False, True])
def test_grouped_completion_hidden_equals_the_one_pass_with_gradients(use_checkpointing):
    """The [SEG] passes' states (one teacher-forced answer per prompt) through the grouped layer calls: equal to
    completion_hidden's one transformers forward, and so is the gradient of the prompt and of every LoRA tensor."""
    from projects.llava_sam2.rl_train.model.decoding.generation import completion_hidden
    from projects.llava_sam2.rl_train.model.decoding.grouped_scoring import grouped_completion_hidden
    lm = lora_lm()
    if use_checkpointing:
        lm.gradient_checkpointing_enable()
    lm.train()
    ids, attention, answers, _ = group_batch(G=1, T=4)
    answer_mask = torch.ones_like(answers, dtype=torch.bool)
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids)
    weights = torch.linspace(-1.0, 1.0, 3 * 4 * SIZES["hidden_size"]).reshape(3, 4, -1) / SIZES["hidden_size"]

    def states_and_grads(fn):
        lm.zero_grad(set_to_none=True)
        x = embeds.detach().clone().requires_grad_(True)
        states = fn(lm, x, attention, answers, answer_mask)
        (weights * states).sum().backward()
        return states.detach(), x.grad, {n: p.grad.clone() for n, p in lm.named_parameters() if p.requires_grad}

    calls = []
    layer0 = lm.get_decoder().layers[0]
    hook = layer0.register_forward_pre_hook(lambda module, args: calls.append(tuple(args[0].shape[:2])))
    grouped = states_and_grads(grouped_completion_hidden)
    hook.remove()
    assert calls == [(3, 7), (3, 4)] * (2 if use_checkpointing else 1)  # prompts, then answers (recomputed)
    one_pass = states_and_grads(completion_hidden)
    torch.testing.assert_close(grouped[0], one_pass[0], **TOL)
    torch.testing.assert_close(grouped[1], one_pass[1], **TOL)
    for name, grad in grouped[2].items():
        assert grad.abs().sum() > 0, f"{name} got no gradient"
        torch.testing.assert_close(grad, one_pass[2][name], **TOL, msg=name)


def test_seg_prompts_of_forced_answers_run_the_compiled_layer_calls(monkeypatch):
    """forced_seg_prompts (loop 2's policy, reference and loss passes) goes through grouped_hidden when the LM's layers
    are compiled for the loss pass, so those graphs serve it; eager, through transformers' one forward; the values
    are the same."""
    from projects.llava_sam2.rl_train.model.decoding import grouped_scoring
    from projects.llava_sam2.rl_train.model.decoding.generation import completion_hidden
    from projects.llava_sam2.rl_train.model.pipeline import shared
    model, _ = build_tiny()
    model.eval()
    lm = model.language_model
    ids, attention, answers, _ = group_batch(G=1, T=3)
    ids = ids % lm.get_input_embeddings().num_embeddings
    answers = answers % lm.get_input_embeddings().num_embeddings
    seg_index = torch.tensor([1, 2, 0])
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids)
        seen = []
        grouped_hidden = grouped_scoring.grouped_hidden
        monkeypatch.setattr(grouped_scoring, "grouped_hidden",
                            lambda *a, **k: seen.append(a[4].shape) or grouped_hidden(*a, **k))
        eager = shared.forced_seg_prompts(model, embeds, attention, answers, seg_index)
        assert seen == []
        grouped_scoring.compile_group_layers(lm, "eager")  # dynamo's capture alone: the cheapest backend on CPU
        try:
            compiled = shared.forced_seg_prompts(model, embeds, attention, answers, seg_index)
        finally:
            grouped_scoring.compile_group_layers(lm, None)
            torch.compiler.reset()
        assert seen == [answers.shape]
        states = completion_hidden(lm, embeds, attention, answers, torch.ones_like(answers, dtype=torch.bool))
        expected = model.seg_hidden_to_prompt(states[torch.arange(3), seg_index])
    torch.testing.assert_close(eager, expected, **TOL)
    torch.testing.assert_close(compiled, expected, **TOL)
