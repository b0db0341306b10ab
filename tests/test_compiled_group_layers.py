"""model/decoding/grouped_scoring.py compile_group_layers: the grouped loss pass with each decoder layer's call through
torch.compile equals the eager pass (fp32: log-probs and the gradient of every trainable tensor within 1e-5, the bound
for a backend that reorders float sums; the backend used here, dynamo's capture with eager kernels, runs the same
operations; Inductor takes minutes to compile on CPU, too slow for a test), the no-grad rollout scoring stays
bit-identical to the compiled loss pass, the layers share one graph and later calls (the same or other lengths)
compile nothing; past torch's recompile limit the layers run eagerly with the same values; with compiled layers the
rollout's old_logp is scored by the loss pass's own graph (grad on, train mode), bit-equal even where a backend's
no-grad graph rounds differently. GRPOConfig.compile_loss_layers reaches the model through CycleGRPO, and the bench's
--compile-loss-layers / sweep key loss=."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from grpo_tiny import RecordedLogp, build_tiny, make_algo, one_thread, run_rollout, shapes_batch, step_loss
from projects.llava_sam2.rl_train.grpo.cycle import caption_logp
from projects.llava_sam2.rl_train.model.decoding.text_decoding import eval_mode
from projects.llava_sam2.rl_train.benchmarks import rl_step as bench
from projects.llava_sam2.rl_train.model.decoding.generation import decoder_and_head
from projects.llava_sam2.rl_train.model.decoding.grouped_scoring import COMPILE_ATTRIBUTE, compile_group_layers, \
    grouped_completion_logprobs
from test_grouped_scoring import group_batch, lora_lm, score_with_grad

_one_thread = pytest.fixture(autouse=True)(one_thread)

TOL = dict(atol=1e-5, rtol=1e-5)
G = 3


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts and leaves with no compiled code (the caches live on the code object, across models)."""
    torch.compiler.reset()
    counters.clear()
    yield
    torch.compiler.reset()


def compiled_graphs() -> int:
    return counters["stats"]["unique_graphs"]


def test_compiled_layers_share_one_graph_and_later_calls_compile_nothing():
    lm = lora_lm(num_hidden_layers=4)
    lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm.train()
    ids, attention, completion_ids, completion_mask = group_batch(G=G)
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids)
    eager_logp, eager_prompt_grad, eager_grads = score_with_grad(lm, embeds, attention, completion_ids,
                                                                 completion_mask, G, grouped=True)
    assert compiled_graphs() == 0

    compile_group_layers(lm, "eager")  # dynamo's capture alone: the cheapest backend on CPU
    logp, prompt_grad, grads = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, grouped=True)
    # layer 0's continuation input (token embeddings) needs no grad, layers 1..3 do: two graphs for four layers
    assert compiled_graphs() == 2
    torch.testing.assert_close(logp, eager_logp, **TOL)
    torch.testing.assert_close(prompt_grad, eager_prompt_grad, **TOL)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], **TOL, msg=lambda m: f"{name}: {m}")

    score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, grouped=True)  # same shapes
    assert compiled_graphs() == 2

    ids, attention, completion_ids, completion_mask = group_batch(lengths=(3, 9, 5), G=G, T=4, seed=2)
    with torch.no_grad():  # other prompt and caption lengths: the sizes are symbolic, the graphs serve them too
        embeds = lm.get_input_embeddings()(ids)
    logp = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, grouped=True)[0]
    assert compiled_graphs() == 2 and logp.shape == (9, 4)

    compile_group_layers(lm, None)  # back to eager: nothing more compiles
    score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, grouped=True)
    assert compiled_graphs() == 2


def test_loop1_loss_pass_on_tiny_sa2va_is_the_same_with_compiled_layers():
    """caption_logp on the tiny Sa2VA (peft-wrapped Qwen2, checkpointed, train mode): compiled layers give the eager
    log-probs and the gradient of every trainable tensor (LoRA, and mlp1 through the image tokens of the prompt);
    the compiled no-grad rollout scoring equals the compiled loss pass bit for bit."""
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, {"mask_to_caption": [dict(type="iou")]}, caption_to_mask_weight=0.0)
    step = run_rollout(algo, shapes_batch(2))
    features, (rollout,) = step.features, step.rollouts
    model.language_model.gradient_checkpointing_enable()
    model.train()
    replay, samples, temperature = rollout.replay, range(2), 0.7
    g = torch.Generator().manual_seed(0)
    N, T = rollout.action_mask.shape  # random weights never stop a caption: cut the rows at 1..T tokens
    completion_mask = torch.arange(T)[None] < torch.randint(1, T + 1, (N,), generator=g)[:, None]  # [N, T]
    weights = torch.randn(N, T, generator=g)

    def grads_of():
        model.zero_grad(set_to_none=True)
        logp = caption_logp(model, features, model.project_vision(features.vit_tokens), replay, completion_mask,
                            samples, rollout.group_size, temperature, "reference")
        (weights * logp).sum().backward()
        return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    eager_logp, eager_grads = grads_of()
    compile_group_layers(model.language_model, "eager")  # dynamo's capture alone: the cheapest backend on CPU
    logp, grads = grads_of()
    assert compiled_graphs() > 0 and 8 < completion_mask.sum() < N * T
    torch.testing.assert_close(logp, eager_logp, **TOL)
    assert grads.keys() == eager_grads.keys()
    assert any(n.startswith("mlp1") for n in grads) and sum("lora_" in n for n in grads) == 2 * 2 * 7
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], **TOL, msg=lambda m: f"{name}: {m}")
    model.eval()
    with torch.no_grad():
        old_logp = caption_logp(model, features, model.project_vision(features.vit_tokens), replay, completion_mask,
                                samples, rollout.group_size, temperature, "reference")
    assert torch.equal(old_logp, logp)


def no_grad_graphs_perturbed(graph, example_inputs):
    """A torch.compile backend whose graphs compiled with grad disabled add 1e-3 to their outputs, those compiled
    with grad on run as captured: a stand-in for Inductor compiling the inference graph and the training graph
    separately (their float rounding may differ on a GPU)."""
    if torch.is_grad_enabled():
        return graph.forward

    def perturbed(*args):
        return [out + 1e-3 if torch.is_tensor(out) and out.is_floating_point() else out for out in graph(*args)]
    return perturbed


def test_old_logp_with_compiled_layers_is_the_loss_pass_bit_for_bit():
    """Fault: the compiled no-grad graph rounds differently from the training graph (``no_grad_graphs_perturbed``).
    The rollout's old_logp still equals the loss pass's log-probs bit for bit, over two minibatch chunks, in both loops
    whose scoring runs the compiled layers (loop 1's captions; loop 2's answer tokens with the deterministic mask)."""
    model, processor = build_tiny()
    model.language_model.gradient_checkpointing_enable()
    model.train()  # as GRPOLoop: train mode around the whole step
    algo, _ = make_algo(model, processor, {"mask_to_caption": [dict(type="iou")], "caption_to_mask": [dict(
        type="iou")]}, minibatch_size=4, mask_policy="deterministic", use_partner_captions=False)
    compile_group_layers(model.language_model, no_grad_graphs_perturbed)
    step = run_rollout(algo, shapes_batch(2))
    recorded = {loop.name: RecordedLogp(loop.loss_fn) for loop in algo.loops}
    for loop in algo.loops:
        loop.loss_fn = recorded[loop.name]
    step_loss(algo, model, step)
    for name in ("mask_to_caption", "caption_to_mask"):
        assert len(recorded[name].seen) == 2  # two minibatches of one group each
        for logp, old_logp in recorded[name].seen:
            assert old_logp is not None and old_logp.grad_fn is None and logp.shape == old_logp.shape  # detached
            assert torch.equal(old_logp, logp), f"{name}: max |diff| {(old_logp - logp).abs().max()}"
    # the fault is live: the same scoring with grad off, as the sampling pass runs it, gives other values
    answer_loop, rollout = algo.loops[1], step.rollouts[1]
    with torch.no_grad(), eval_mode(model):
        no_grad_logp = answer_loop.action_logp(model, step.features, model.project_vision(step.features.vit_tokens),
                                               rollout, range(2))
    assert not torch.equal(no_grad_logp, torch.cat([logp for logp, _ in recorded["caption_to_mask"].seen]))
    assert compiled_graphs() == 3  # no grad (the sampling pass); grad: layer 0 and the others


def test_old_logp_is_scored_by_the_loss_graph_only_with_compiled_layers_and_no_active_dropout():
    """Eager layers: the no-grad sampling pass is already bit-equal to the loss pass, so it keeps scoring old_logp.
    Active dropout: the loss scores a perturbed policy that no old_logp equals, so the eval-mode values stay."""
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, {"mask_to_caption": [dict(type="iou")]}, caption_to_mask_weight=0.0)
    assert not algo._scores_old_logp_with_the_loss_graph()
    compile_group_layers(model.language_model, "eager")
    assert algo._scores_old_logp_with_the_loss_graph()
    next(m for m in model.modules() if isinstance(m, torch.nn.Dropout)).p = 0.05  # as disable_dropout=False leaves it
    assert not algo._scores_old_logp_with_the_loss_graph()


def test_past_the_recompile_limit_the_layers_run_eagerly_with_the_same_values():
    """Fault: more graphs than torch's recompile limit (here 1) -> the layers past it run uncompiled, same values.
    (torch's own config.patch: pytest's monkeypatch would delete the setting on undo and break later compiles.)"""
    lm = lora_lm(num_hidden_layers=2)
    ids, attention, completion_ids, completion_mask = group_batch(G=G)
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids)
    eager_logp, _, eager_grads = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, True)
    compile_group_layers(lm, "eager")
    with torch._dynamo.config.patch(recompile_limit=1):
        logp, _, grads = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, True)
    assert hasattr(torch._dynamo.config, "recompile_limit")
    assert compiled_graphs() == 1  # layer 1's graph would be the second
    torch.testing.assert_close(logp, eager_logp, **TOL)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], **TOL)


def test_config_switch_reaches_the_scoring_lm_and_a_new_trainer_resets_it():
    model, processor = build_tiny()
    body, _ = decoder_and_head(model.language_model)
    rewards = {"mask_to_caption": [dict(type="iou")]}
    make_algo(model, processor, rewards, caption_to_mask_weight=0.0, compile_loss_layers=True)
    assert getattr(body, COMPILE_ATTRIBUTE) == "inductor"
    make_algo(model, processor, rewards, caption_to_mask_weight=0.0)
    assert getattr(body, COMPILE_ATTRIBUTE) is None


def test_bench_sweep_key_loss():
    assert bench.sweep_point("loss=compiled,G=4") == {"compile_loss_layers": True, "num_generations": 4}
    assert bench.sweep_point("loss=eager") == {"compile_loss_layers": False}
    with pytest.raises(ValueError, match="loss=fast"):
        bench.sweep_point("loss=fast")
    assert bench.parse_args(["--compile-loss-layers"]).compile_loss_layers
    assert not bench.parse_args([]).compile_loss_layers


def test_compiled_layer_graphs_are_whole_under_ddp_and_hold_the_prompt_by_a_view():
    """What the compiled layer call traces, on the ops that failed on 2 H100s (docs/benchmarks.md, Round 5): Dynamo's
    DDP optimizer is off while it compiles (it split the graphs under a DDP forward and failed inside AOTAutograd),
    and the prompt's keys/values reach the G rows through an expand, not repeat_interleave (whose fake-tensor trace
    with a symbolic G failed under DeepSpeed ZeRO-2); G takes several values, as the loops' calls give it."""
    seen = []

    def recording(graph, example_inputs):
        seen.append((torch._dynamo.config.optimize_ddp,
                     {str(node.target) for node in graph.graph.nodes if node.op in ("call_function", "call_method")}))
        return graph.forward

    lm = lora_lm()
    lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm.train()
    compile_group_layers(lm, recording)
    for group_size, seed in ((3, 1), (2, 3)):
        ids, attention, completion_ids, completion_mask = group_batch(G=group_size, seed=seed)
        with torch.no_grad():
            embeds = lm.get_input_embeddings()(ids)
        eager = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, group_size, grouped=False)
        compiled = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, group_size, grouped=True)
        torch.testing.assert_close(compiled[0], eager[0], **TOL)
    assert seen and all(optimize_ddp is False for optimize_ddp, _ in seen)
    assert not any("repeat_interleave" in target for _, targets in seen for target in targets)
    assert torch._dynamo.config.optimize_ddp  # the process's own setting is left as it was
