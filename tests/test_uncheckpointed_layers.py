"""model/decoding/grouped_scoring.py keep_last_layers_activations (GRPOConfig.uncheckpointed_layers): with activation
checkpointing on, the last k decoder layers of the grouped loss pass keep their activations for backward. Log-probs and
the gradient of every trainable tensor are bit-identical for every k (fp32); backward re-runs exactly the first L - k
layers; the knob is validated, reaches the scoring LM through CycleGRPO, and the bench takes it (--uncheckpointed-layers,
sweep key keep=)."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from grpo_tiny import build_tiny, make_algo, one_thread, run_rollout, shapes_batch
from projects.llava_sam2.rl_train.benchmarks import rl_step as bench
from projects.llava_sam2.rl_train.grpo.config import GRPOConfig
from projects.llava_sam2.rl_train.grpo.cycle import caption_logp
from projects.llava_sam2.rl_train.model.decoding.generation import decoder_and_head
from projects.llava_sam2.rl_train.model.decoding.grouped_scoring import (
    UNCHECKPOINTED_ATTRIBUTE, grouped_completion_logprobs, keep_last_layers_activations)
from test_grouped_scoring import group_batch, lora_lm

_one_thread = pytest.fixture(autouse=True)(one_thread)

G = 3


class LayerCalls:
    """Counts the forward calls of each decoder layer (a pre-hook: a recompute that stops early still counts)."""

    def __init__(self, lm):
        body, _ = decoder_and_head(lm)
        self.counts = Counter()
        for index, layer in enumerate(body.layers):
            layer.register_forward_pre_hook(lambda module, args, index=index: self.counts.update([index]))

    def take(self) -> dict[int, int]:
        counts, self.counts = dict(self.counts), Counter()
        return counts


def test_backward_recomputes_only_the_checkpointed_layers_and_values_are_unchanged():
    """4 layers, checkpointed, train mode: with the last k kept, backward re-runs layers 0 .. 3 - k only (each layer
    call is two layer forwards: the prompts, then the completions), and log-probs, the prompt gradient and every
    LoRA gradient equal those of k = 0 bit for bit."""
    lm = lora_lm(num_hidden_layers=4)
    lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm.train()
    ids, attention, completion_ids, completion_mask = group_batch(G=G)
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids)
    calls = LayerCalls(lm)
    results = {}
    for k in (0, 2, 4):
        keep_last_layers_activations(lm, k)
        lm.zero_grad(set_to_none=True)
        x = embeds.clone().requires_grad_(True)
        logp = grouped_completion_logprobs(lm, x, attention, completion_ids, completion_mask, num_generations=G,
                                           temperature=0.7)
        assert calls.take() == {0: 2, 1: 2, 2: 2, 3: 2}
        (torch.linspace(-1.0, 1.0, logp.numel()).reshape(logp.shape) * logp).sum().backward()
        assert calls.take() == {index: 2 for index in range(4 - k)}, f"k={k}"
        results[k] = (logp.detach(), x.grad, {n: p.grad.clone() for n, p in lm.named_parameters() if p.requires_grad})
    logp, prompt_grad, grads = results[0]
    assert len(grads) == 4 * 7 * 2 and all(grad.abs().sum() > 0 for grad in grads.values())
    for k in (2, 4):
        assert torch.equal(results[k][0], logp) and torch.equal(results[k][1], prompt_grad), f"k={k}"
        for name, grad in grads.items():
            assert torch.equal(results[k][2][name], grad), f"k={k}: {name}"


def test_loop1_loss_pass_on_tiny_sa2va_is_the_same_with_kept_layers():
    """caption_logp on the tiny Sa2VA (2 LM layers, checkpointed, train mode), k = 0, 1, 2: the same log-probs and the
    same gradient of every trainable tensor (LoRA, and mlp1 through the image tokens), bit for bit."""
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, {"mask_to_caption": [dict(type="iou")]}, caption_to_mask_weight=0.0)
    step = run_rollout(algo, shapes_batch(2))
    features, (rollout,) = step.features, step.rollouts
    model.language_model.gradient_checkpointing_enable()
    model.train()
    g = torch.Generator().manual_seed(0)
    N, T = rollout.action_mask.shape  # random weights never stop a caption: cut the rows at 1..T tokens
    completion_mask = torch.arange(T)[None] < torch.randint(1, T + 1, (N,), generator=g)[:, None]  # [N, T]
    weights = torch.randn(N, T, generator=g)

    def grads_of():
        model.zero_grad(set_to_none=True)
        logp = caption_logp(model, features, model.project_vision(features.vit_tokens), rollout.replay,
                            completion_mask, range(2), rollout.group_size, 0.7, "reference")
        (weights * logp).sum().backward()
        return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    results = {}
    for k in (0, 1, 2):
        keep_last_layers_activations(model.language_model, k)
        results[k] = grads_of()
    logp, grads = results[0]
    assert any(n.startswith("mlp1") for n in grads) and sum("lora_" in n for n in grads) == 2 * 2 * 7
    for k in (1, 2):
        assert torch.equal(results[k][0], logp), f"k={k}"
        assert results[k][1].keys() == grads.keys()
        for name, grad in grads.items():
            assert torch.equal(results[k][1][name], grad), f"k={k}: {name}"


def test_the_knob_is_validated_and_reaches_the_scoring_lm():
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="uncheckpointed_layers=.*int >= 0"):
            GRPOConfig(uncheckpointed_layers=bad)
    model, processor = build_tiny()
    body, _ = decoder_and_head(model.language_model)
    rewards = {"mask_to_caption": [dict(type="iou")]}
    make_algo(model, processor, rewards, caption_to_mask_weight=0.0, uncheckpointed_layers=2)
    assert getattr(body, UNCHECKPOINTED_ATTRIBUTE) == 2
    make_algo(model, processor, rewards, caption_to_mask_weight=0.0)  # a new trainer follows its own config
    assert getattr(body, UNCHECKPOINTED_ATTRIBUTE) == 0
    with pytest.raises(ValueError, match="uncheckpointed_layers=3: .* has 2 decoder layers; use an int from 0"):
        make_algo(model, processor, rewards, caption_to_mask_weight=0.0, uncheckpointed_layers=3)


def test_bench_flag_and_sweep_key_keep():
    assert bench.sweep_point("keep=12,G=4") == {"uncheckpointed_layers": 12, "num_generations": 4}
    assert bench.parse_args(["--uncheckpointed-layers", "3"]).uncheckpointed_layers == 3
    # left out: the preset's released config on CUDA (the 4b one keeps 8), GRPOConfig's 0 elsewhere
    assert bench.parse_args([]).uncheckpointed_layers is None
    assert bench.fill_step_defaults(bench.parse_args([]), "cpu").uncheckpointed_layers == 0
    assert bench.fill_step_defaults(bench.parse_args(["--preset", "4b"]), "cpu").uncheckpointed_layers == 0
    assert bench.fill_step_defaults(bench.parse_args(["--preset", "4b"]), "cuda").uncheckpointed_layers == 8
    assert bench.fill_step_defaults(bench.parse_args(["--preset", "8b"]), "cuda").uncheckpointed_layers == 0
    assert bench.fill_step_defaults(bench.parse_args(["--preset", "4b", "--uncheckpointed-layers", "2"]),
                                    "cuda").uncheckpointed_layers == 2
    with pytest.raises(ValueError, match="keep=-1"):
        bench.sweep_point("keep=-1")
