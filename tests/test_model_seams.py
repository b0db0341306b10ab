"""Canaries for the transformers and torch internals that layers below engine/ rely on (model/network/transformers_seams.py,
model/network/torch_seams.py), and for the public replacement of torch's private dropout base class (grpo/trainer.py).

Each test names the installed version and what changed when an upgrade breaks an assumption.
"""
import pytest
import torch
import transformers
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from projects.llava_sam2.rl_train.grpo.trainer import DROPOUT_TYPES, zero_dropout
from projects.llava_sam2.rl_train.model.network.torch_seams import foreach_copy_, foreach_lerp_
from projects.llava_sam2.rl_train.model.network.transformers_seams import (attention_implementation,
                                                                   has_input_require_grads_hook,
                                                                   set_attention_implementation, using_attention)

TRANSFORMERS = f"transformers {transformers.__version__}"
TORCH = f"torch {torch.__version__}"
SIZES = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
ARCHITECTURES = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM),
                 "phi3": (Phi3Config, Phi3ForCausalLM)}


def tiny_lm(arch: str):
    torch.manual_seed(0)
    config_cls, lm_cls = ARCHITECTURES[arch]
    config = config_cls(**SIZES, pad_token_id=0)
    set_attention_implementation(config, "sdpa")
    return lm_cls(config).eval()


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_the_attention_layers_run_the_kernel_the_config_names_at_call_time(arch, monkeypatch):
    lm = tiny_lm(arch)
    calls = []
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def recording_attention(module, *args, **kwargs):
        calls.append(type(module).__name__)
        return sdpa(module, *args, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "recording", recording_attention)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        expected = lm(ids).logits
        with using_attention(lm.config, "recording"):
            assert attention_implementation(lm.config) == "recording"
            logits = lm(ids).logits
    assert calls, (f"{TRANSFORMERS}: {arch}'s attention no longer dispatches on config._attn_implementation at "
                   "call time; transformers_seams.using_attention (the fast decoder's grouped-query decode step) "
                   "and set_attention_implementation (language.hf_llm_config) must use the new switch.")
    assert torch.equal(logits, expected)
    assert attention_implementation(lm.config) == "sdpa"  # restored


def test_using_attention_restores_the_kernel_after_an_error():
    config = Qwen2Config(**SIZES)
    set_attention_implementation(config, "eager")
    with pytest.raises(RuntimeError, match="boom"), using_attention(config, "sdpa"):
        raise RuntimeError("boom")
    assert attention_implementation(config) == "eager"


def test_enable_input_require_grads_keeps_the_hook_where_the_seam_reads_it():
    lm = tiny_lm("qwen2")
    assert not has_input_require_grads_hook(lm)
    lm.enable_input_require_grads()
    assert has_input_require_grads_hook(lm), (
        f"{TRANSFORMERS}: enable_input_require_grads no longer keeps its hook as _require_grads_hook; "
        "transformers_seams.has_input_require_grads_hook (model/lora.py configure_trainable) must find it elsewhere, "
        "or a LoRA model with gradient checkpointing gets the hook twice.")


def test_foreach_ops_equal_one_op_per_tensor_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    shadow = [torch.randn(5, generator=g), torch.randn(2, 3, generator=g)]
    policy = [torch.randn(5, generator=g), torch.randn(2, 3, generator=g)]
    expected = [s.clone().lerp_(p, 0.001) for s, p in zip(shadow, policy)]
    foreach_lerp_(shadow, policy, 0.001)
    assert all(torch.equal(a, b) for a, b in zip(shadow, expected)), f"{TORCH}: _foreach_lerp_ != lerp_ per tensor"
    targets = [torch.zeros(5), torch.zeros(2, 3)]
    foreach_copy_(targets, policy)
    assert all(torch.equal(a, b) for a, b in zip(targets, policy)), f"{TORCH}: _foreach_copy_ != copy_ per tensor"


def test_dropout_types_are_every_dropout_module_of_torch_nn():
    from torch.nn.modules.dropout import _DropoutNd  # read here only, to check the public list is complete

    torch_dropouts = {cls for cls in vars(nn).values() if isinstance(cls, type) and issubclass(cls, _DropoutNd)}
    assert torch_dropouts == set(DROPOUT_TYPES), (
        f"{TORCH}: torch.nn's dropout modules are now {sorted(c.__name__ for c in torch_dropouts)}; "
        "grpo/trainer.py DROPOUT_TYPES (zero_dropout) must list them all.")
    model = nn.Sequential(*(cls(p=0.25) for cls in DROPOUT_TYPES), nn.Linear(2, 2))
    assert zero_dropout(model) == len(DROPOUT_TYPES)
    assert all(module.p == 0.0 for module in model if isinstance(module, DROPOUT_TYPES))
