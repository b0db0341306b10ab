"""Canaries for the transformers, torch and sam2 internals that layers below engine/ rely on
(model/network/transformers_seams.py, model/network/torch_seams.py, model/network/sam2_seams.py), and for the public replacement of torch's private dropout base class (grpo/trainer.py).

Each test names the installed version and what changed when an upgrade breaks an assumption.
"""
import pytest
import torch
import transformers
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from projects.llava_sam2.rl_train.grpo.trainer import DROPOUT_TYPES, zero_dropout
from projects.llava_sam2.rl_train.model.network.sam2_seams import (
    ENCODE_MEMORY_METHOD, MEMORY_CONDITIONED_METHOD, SAM2_VERSION, encode_memory, memory_conditioned_embed)
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


def test_sam2_memory_steps_take_the_arguments_the_seam_passes_and_read_the_bank():
    import inspect

    from sam2.modeling.sam2_base import SAM2Base

    from projects.llava_sam2.rl_train.model.network.grounding import build_sam2
    from projects.llava_sam2.rl_train.model.network.presets import build_preset

    expected = {MEMORY_CONDITIONED_METHOD: {"frame_idx", "is_init_cond_frame", "current_vision_feats",
                                            "current_vision_pos_embeds", "feat_sizes", "output_dict", "num_frames"},
                ENCODE_MEMORY_METHOD: {"current_vision_feats", "feat_sizes", "pred_masks_high_res",
                                       "object_score_logits", "is_mask_from_pts"}}
    for method, names in expected.items():
        params = set(inspect.signature(getattr(SAM2Base, method)).parameters)
        assert names <= params, (f"sam2 {SAM2_VERSION}: SAM2Base.{method} now takes {sorted(params)}; "
                                 "model/network/sam2_seams.py must pass its new arguments.")
    torch.manual_seed(0)
    sam = build_sam2(build_preset("tiny", vocab_size=8).grounding).eval()
    C, e, S = sam.hidden_dim, sam.image_size // sam.backbone_stride, sam.image_size
    vision, position = torch.randn(e * e, 1, C), torch.randn(e * e, 1, C)
    with torch.no_grad():
        memory, memory_pos = encode_memory(sam, vision, (e, e), torch.randn(1, 1, S, S), torch.ones(1, 1), True)
        assert memory.shape == (1, sam.mem_dim, e, e) and memory_pos[-1].shape == memory.shape
        entry = {"maskmem_features": memory, "maskmem_pos_enc": memory_pos, "obj_ptr": torch.randn(1, C)}
        fused = [memory_conditioned_embed(sam, 1, vision, position, (e, e),
                                          {"cond_frame_outputs": {0: bank_entry}, "non_cond_frame_outputs": {}}, 2)
                 for bank_entry in (entry, {**entry, "maskmem_features": -memory})]
    assert fused[0].shape == (1, C, e, e)
    assert not torch.allclose(fused[0], fused[1]), (
        f"sam2 {SAM2_VERSION}: SAM2Base.{MEMORY_CONDITIONED_METHOD} no longer reads maskmem_features from "
        "output_dict['cond_frame_outputs']; sam2_seams.memory_conditioned_embed must build the bank it reads.")
