"""model/decoding/layer_graphs.py: the grouped layer loop recorded per key and replayed, with gradients.

CUDA graphs need a GPU, so these tests swap the recorder for one that "replays" by running the recorded functions
again into the same static tensors (the forward under no_grad, the backward as forward + autograd.grad). That keeps
everything around the capture real: the keys, the static inputs, the autograd node that hands the parameters their
gradients, the copies, the one-forward-in-flight rule, the fallbacks. A replay that read the wrong inputs, returned
gradients to the wrong tensors or let two forwards share one graph shows up as a wrong value here. The CUDA recorder
itself is checked on a GPU (research/layer_graphs_gpu_check.py, docs/speed.md)."""
from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

from grpo_tiny import one_thread
from projects.llava_sam2.rl_train.grpo.config import GRPOConfig
from projects.llava_sam2.rl_train.model.decoding.generation import decoder_and_head
from projects.llava_sam2.rl_train.model.decoding.grouped_scoring import grouped_completion_logprobs
from projects.llava_sam2.rl_train.model.decoding.layer_graphs import GRAPH_ATTRIBUTE, LayerGraphs, graph_group_layers
from test_grouped_scoring import group_batch, lora_lm, score_with_grad

_one_thread = pytest.fixture(autouse=True)(one_thread)

G = 3


class RerunRecorder:
    """Stands in for the CUDA recorder on CPU: a replay runs the recorded function again into its static tensors."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.warm_ups = 0

    def new_pool(self):
        return object()

    def warm_up(self, run) -> None:
        self.warm_ups += 1
        run()

    def record(self, forward, backward, pool):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        outputs = forward()
        grads = None if backward is None else backward(outputs)

        def replay_forward():
            with torch.no_grad():
                for static, fresh in zip(outputs, forward()):
                    static.copy_(fresh)

        def replay_backward():
            with torch.enable_grad():
                fresh = backward(forward())
            for static, value in zip(grads, fresh):
                if static is not None:
                    static.copy_(value)

        return replay_forward, None if backward is None else replay_backward, outputs, grads


def graphs_of(lm) -> LayerGraphs:
    return getattr(decoder_and_head(lm)[0], GRAPH_ATTRIBUTE)


def checkpointed_lm(**overrides):
    lm = lora_lm(num_hidden_layers=3, **overrides)
    lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm.train()
    return lm


def batch(**kwargs):
    ids, attention, completion_ids, completion_mask = group_batch(G=G, **kwargs)
    return ids, attention, completion_ids, completion_mask


def embeds_of(lm, ids):
    with torch.no_grad():
        return lm.get_input_embeddings()(ids)


def assert_same(a, b):
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def assert_same_grads(grads, expected):
    assert grads.keys() == expected.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[name], atol=0, rtol=0, msg=lambda m: f"{name}: {m}")


def test_replayed_loss_pass_equals_the_eager_one_with_every_gradient():
    lm = checkpointed_lm()
    ids, attention, completion_ids, completion_mask = batch()
    embeds = embeds_of(lm, ids)
    expected = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, grouped=True)

    recorder = RerunRecorder()
    graph_group_layers(lm, True, recorder=recorder)
    graphs = graphs_of(lm)
    for call in range(3):  # the first call runs eagerly and records; the later ones replay
        logp, prompt_grad, grads = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G,
                                                   grouped=True)
        assert_same(logp, expected[0])
        assert_same(prompt_grad, expected[1])
        assert_same_grads(grads, expected[2])
        assert all(grad.abs().sum() > 0 for grad in grads.values())  # LoRA of every layer gets a gradient
    assert graphs.counts == dict(eager_first=1, captured=1, replayed=2, eager_busy=0, eager_failed=0)
    assert recorder.warm_ups == 1

    # another length is another key: eager and recorded once, then replayed
    ids, attention, completion_ids, completion_mask = batch(lengths=(3, 9, 5), T=4, seed=2)
    embeds = embeds_of(lm, ids)
    graph_group_layers(lm, False)
    expected = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, grouped=True)
    graph_group_layers(lm, True, recorder=recorder)
    graphs = graphs_of(lm)
    for _ in range(2):
        logp, prompt_grad, grads = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G,
                                                   grouped=True)
        assert_same(logp, expected[0])
        assert_same_grads(grads, expected[2])
    assert graphs.counts["captured"] == 1 and graphs.counts["replayed"] == 1


def test_gradients_of_two_replayed_backwards_accumulate():
    """Each backward hands autograd a copy of the graph's gradient: a .grad that kept the graph's own tensor would be
    overwritten by the next replay (the first minibatch's gradient lost, the second counted twice)."""
    lm = checkpointed_lm()
    ids, attention, completion_ids, completion_mask = batch()
    embeds = embeds_of(lm, ids)

    def two_minibatches():
        lm.zero_grad(set_to_none=True)
        for scale in (1.0, 3.0):  # one backward each, one gradient
            prompt = embeds.detach().clone().requires_grad_(True)
            logp = grouped_completion_logprobs(lm, prompt, attention, completion_ids, completion_mask,
                                               num_generations=G, temperature=0.7)
            (scale * torch.linspace(-1.0, 1.0, logp.numel()).reshape(logp.shape) * logp).sum().backward()
        return {name: p.grad.clone() for name, p in lm.named_parameters() if p.requires_grad}

    expected = two_minibatches()
    graph_group_layers(lm, True, recorder=RerunRecorder())
    two_minibatches()  # records, then replays
    grads = two_minibatches()  # replays both
    assert graphs_of(lm).counts["replayed"] == 3
    assert_same_grads(grads, expected)


def test_a_second_forward_before_the_first_backward_runs_eagerly():
    """Two loops' forwards then one backward: the graph keeps one forward's activations, so a second forward of the
    same key runs eagerly; the summed gradient is the eager one. A forward whose graph was dropped (old_logp,
    detached) frees the graph again."""
    lm = checkpointed_lm()
    ids, attention, completion_ids, completion_mask = batch()
    embeds = embeds_of(lm, ids)
    other_ids = (ids * 7 + 3) % 50 * attention
    other = embeds_of(lm, other_ids)

    def two_forwards_one_backward():
        lm.zero_grad(set_to_none=True)
        total = 0
        for prompt, scale in ((embeds, 1.0), (other, -2.0)):
            logp = grouped_completion_logprobs(lm, prompt, attention, completion_ids, completion_mask,
                                               num_generations=G, temperature=0.7)
            total = total + scale * (torch.linspace(-1.0, 1.0, logp.numel()).reshape(logp.shape) * logp).sum()
        total.backward()
        return {name: p.grad.clone() for name, p in lm.named_parameters() if p.requires_grad}

    expected = two_forwards_one_backward()
    graph_group_layers(lm, True, recorder=RerunRecorder())
    graphs = graphs_of(lm)

    two_forwards_one_backward()  # eager + record, then the second forward replays
    # one backward sums the two forwards' contributions in another order than eager: float rounding only
    grads = two_forwards_one_backward()  # replay, then busy: eager
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    assert graphs.counts["eager_busy"] == 1 and graphs.counts["replayed"] == 2

    grouped_completion_logprobs(lm, embeds, attention, completion_ids, completion_mask, num_generations=G).detach()
    grouped_completion_logprobs(lm, embeds, attention, completion_ids, completion_mask, num_generations=G).sum()
    assert graphs.counts["replayed"] == 4 and graphs.counts["eager_busy"] == 1


def test_no_grad_scoring_and_the_reference_are_their_own_keys_and_return_copies():
    lm = checkpointed_lm()
    ids, attention, completion_ids, completion_mask = batch()
    embeds = embeds_of(lm, ids)
    other = embeds_of(lm, (ids * 7 + 3) % 50 * attention)

    def score(prompt):
        with torch.no_grad():
            return grouped_completion_logprobs(lm, prompt, attention, completion_ids, completion_mask,
                                               num_generations=G)

    def reference(prompt):
        with torch.no_grad(), lm.disable_adapter():
            return grouped_completion_logprobs(lm, prompt, attention, completion_ids, completion_mask,
                                               num_generations=G)

    expected = score(embeds), score(other), reference(embeds), reference(other)
    graph_group_layers(lm, True, recorder=RerunRecorder())
    graphs = graphs_of(lm)
    for _ in range(2):
        got = score(embeds), score(other), reference(embeds), reference(other)
        for value, want in zip(got, expected):
            assert_same(value, want)
    assert graphs.counts["captured"] == 2 and graphs.counts["replayed"] == 6
    assert not torch.equal(expected[0], expected[2])  # the adapters matter: the reference key is not the policy's


def test_a_moved_parameter_drops_the_graphs_and_a_failed_capture_runs_eagerly(caplog):
    lm = checkpointed_lm()
    ids, attention, completion_ids, completion_mask = batch()
    embeds = embeds_of(lm, ids)
    graph_group_layers(lm, True, recorder=RerunRecorder())
    graphs = graphs_of(lm)
    for _ in range(2):
        score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, grouped=True)
    assert graphs.counts["replayed"] == 1

    proj = decoder_and_head(lm)[0].layers[1].self_attn.q_proj.base_layer
    proj.weight = nn.Parameter(proj.weight.detach() * 1.5, requires_grad=False)  # new storage: graphs read the old
    eager = copy.deepcopy(lm)
    graph_group_layers(eager, False)
    expected = score_with_grad(eager, embeds, attention, completion_ids, completion_mask, G, grouped=True)
    got = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, grouped=True)
    assert_same(got[0], expected[0])
    assert graphs.counts["eager_first"] == 2 and graphs.counts["captured"] == 2

    failing = LayerGraphs(RerunRecorder(fail=True))
    setattr(decoder_and_head(lm)[0], GRAPH_ATTRIBUTE, failing)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            got = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, grouped=True)
            assert_same(got[0], expected[0])
            assert_same_grads(got[2], expected[2])
    assert failing.counts == dict(eager_first=1, captured=0, replayed=0, eager_busy=0, eager_failed=1)
    assert sum("capture of a gradient pass failed" in r.getMessage() for r in caplog.records) == 1


def test_graphs_stay_off_on_cpu_tensors_under_dropout_and_in_copies():
    lm = checkpointed_lm()
    ids, attention, completion_ids, completion_mask = batch()
    embeds = embeds_of(lm, ids)
    graph_group_layers(lm, True)  # the CUDA recorder: CPU tensors run eagerly, nothing recorded
    score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, grouped=True)
    assert graphs_of(lm).counts["eager_first"] == 0

    dropped = lora_lm(num_hidden_layers=2, attention_dropout=0.1)
    graph_group_layers(dropped, True, recorder=RerunRecorder())
    dropped.train()
    score_with_grad(dropped, embeds_of(dropped, ids), attention, completion_ids, completion_mask, G, grouped=True)
    assert graphs_of(dropped).counts["eager_first"] == 0  # a dropout draws: the eager loop, with its RNG state

    copied = copy.deepcopy(lm)
    assert graphs_of(copied) is not graphs_of(lm) and not graphs_of(copied).entries


def test_grpo_config_turns_the_graphs_on_for_the_scoring_lm():
    from grpo_tiny import build_tiny, make_algo

    model, processor = build_tiny()
    make_algo(model, processor, graph_loss_layers=True)
    assert isinstance(getattr(decoder_and_head(model.language_model)[0], GRAPH_ATTRIBUTE, None), LayerGraphs)
    make_algo(model, processor, graph_loss_layers=False)
    assert not hasattr(decoder_and_head(model.language_model)[0], GRAPH_ATTRIBUTE)
    assert GRPOConfig().graph_loss_layers is False
