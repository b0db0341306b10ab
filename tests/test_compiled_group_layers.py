"""model/decoding/grouped_scoring.py compile_group_layers: the grouped loss pass with each decoder layer's call through
torch.compile equals the eager pass (fp32: log-probs, the prompt gradient and every LoRA gradient within 1e-5, the
bound for a backend that reorders float sums; the graph-only backends used here give the same aten operations), the
no-grad rollout scoring stays bit-identical to the compiled loss pass, and the layers share one graph: a second call
compiles nothing. GRPOConfig.compile_loss_layers reaches the model through CycleGRPO, and the bench's sweep key."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from grpo_tiny import build_tiny, make_algo, one_thread
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
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def compiled_graphs() -> int:
    return counters["stats"]["unique_graphs"]


def test_compiled_layers_equal_the_eager_loss_pass_and_share_one_graph():
    lm = lora_lm(num_hidden_layers=4)
    lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm.train()
    ids, attention, completion_ids, completion_mask = group_batch(G=G)
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids)
    eager_logp, eager_prompt_grad, eager_grads = score_with_grad(lm, embeds, attention, completion_ids,
                                                                 completion_mask, G, grouped=True)
    assert compiled_graphs() == 0

    compile_group_layers(lm, "aot_eager")  # dynamo + AOTAutograd (Inductor's front end), eager kernels
    logp, prompt_grad, grads = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, grouped=True)
    # layer 0's continuation input (token embeddings) needs no grad, layers 1..3 do: two graphs for four layers
    assert compiled_graphs() == 2
    torch.testing.assert_close(logp, eager_logp, **TOL)
    torch.testing.assert_close(prompt_grad, eager_prompt_grad, **TOL)
    assert grads.keys() == eager_grads.keys() and any("lora_A" in name for name in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], **TOL, msg=lambda m: f"{name}: {m}")

    score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, grouped=True)  # same shapes
    assert compiled_graphs() == 2

    with torch.no_grad():  # the rollout's old_logp: eval, no grad, through the same switch
        old_logp = grouped_completion_logprobs(lm.eval(), embeds, attention, completion_ids, completion_mask,
                                               num_generations=G, temperature=0.7)
    assert torch.equal(old_logp, logp)

    compile_group_layers(lm, None)  # back to eager: nothing more compiles
    before = compiled_graphs()
    score_with_grad(lm.train(), embeds, attention, completion_ids, completion_mask, G, grouped=True)
    assert compiled_graphs() == before


def test_past_the_recompile_limit_the_layers_run_eagerly_with_the_same_values(monkeypatch):
    """Fault: more graphs than torch's recompile limit (here 1) -> the layers past it run uncompiled, same values."""
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    lm = lora_lm(num_hidden_layers=2)
    ids, attention, completion_ids, completion_mask = group_batch(G=G)
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids)
    eager_logp, _, eager_grads = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, True)
    compile_group_layers(lm, "eager")
    logp, _, grads = score_with_grad(lm, embeds, attention, completion_ids, completion_mask, G, True)
    assert compiled_graphs() == 1  # layer 1's graph would be the second
    torch.testing.assert_close(logp, eager_logp, **TOL)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], **TOL)


def test_config_switch_reaches_the_scoring_lm_and_a_new_trainer_resets_it():
    model, processor = build_tiny()
    body, _ = decoder_and_head(model.language_model)
    make_algo(model, processor, compile_loss_layers=True)
    assert getattr(body, COMPILE_ATTRIBUTE) == "inductor"
    make_algo(model, processor)
    assert getattr(body, COMPILE_ATTRIBUTE) is None


def test_bench_sweep_key_loss():
    assert bench.sweep_point("loss=compiled,G=4") == {"compile_loss_layers": True, "num_generations": 4}
    assert bench.sweep_point("loss=eager") == {"compile_loss_layers": False}
    with pytest.raises(ValueError, match="loss=fast"):
        bench.sweep_point("loss=fast")
    assert bench.parse_args(["--compile-loss-layers"]).compile_loss_layers
    assert not bench.parse_args([]).compile_loss_layers
