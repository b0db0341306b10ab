"""model/network/lora.py: LoRA wrap, adapter-disabled reference log-probs, the trainable set."""
import pytest
import torch
from peft.helpers import disable_input_dtype_casting
from transformers import Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM

from projects.llava_sam2.rl_train.model.decoding.generation import completion_logprobs
from projects.llava_sam2.rl_train.model.network.lora import (
    LORA_TARGET_MODULES, adapter_compute_dtype, apply_lora, configure_trainable, default_target_modules,
    trainable_parameters)


def tiny_qwen2(seed=0):
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2)).eval()


def tiny_phi3(seed=0):
    torch.manual_seed(seed)
    return Phi3ForCausalLM(Phi3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, pad_token_id=0)).eval()


def score(lm, seed=5):
    """Teacher-forced log-probs of a fixed 2-row batch (prompt 6, completion 4)."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(1, 64, (2, 6), generator=g)
    completion_ids = torch.randint(1, 64, (2, 4), generator=g)
    attention = torch.ones(2, 6, dtype=torch.long)
    attention[1, :2] = 0  # row 1 is left padded
    prompt_embeds = lm.get_input_embeddings()(prompt_ids)
    return completion_logprobs(lm, prompt_embeds, attention, completion_ids, torch.ones(2, 4, dtype=torch.bool))


def perturb_lora_b(peft_lm):
    """LoRA B starts at zero (adapter = identity); give it values so the adapter matters."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in peft_lm.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


@pytest.mark.parametrize("make, arch", [(tiny_qwen2, "Qwen2ForCausalLM"), (tiny_phi3, "Phi3ForCausalLM")])
def test_default_targets_wrap_every_projection(make, arch):
    lm = make()
    peft_lm = apply_lora(lm, r=4, lora_alpha=8, lora_dropout=0.0)
    wrapped = {n.split(".")[-2] for n, _ in peft_lm.named_modules() if n.endswith("lora_A")}
    assert wrapped == set(LORA_TARGET_MODULES[arch])
    assert peft_lm.peft_config["default"].r == 4 and peft_lm.peft_config["default"].lora_alpha == 8
    assert all(not p.requires_grad for n, p in peft_lm.named_parameters() if "lora_" not in n)


def test_unknown_architecture_names_itself_and_the_fix():
    class MysteryForCausalLM(torch.nn.Module):
        pass

    with pytest.raises(ValueError, match="MysteryForCausalLM.*target_modules"):
        default_target_modules(MysteryForCausalLM())
    peft_lm = apply_lora(tiny_qwen2(), r=2, lora_alpha=4, target_modules=["q_proj"])
    assert {n.split(".")[-2] for n, _ in peft_lm.named_modules() if n.endswith("lora_A")} == {"q_proj"}


def test_double_wrap_and_bad_rank_are_rejected():
    peft_lm = apply_lora(tiny_qwen2(), r=2, lora_alpha=4)
    with pytest.raises(ValueError, match="already peft-wrapped"):
        apply_lora(peft_lm)
    with pytest.raises(ValueError, match="r >= 1"):
        apply_lora(tiny_qwen2(), r=0)


@pytest.mark.parametrize("make", [tiny_qwen2, tiny_phi3])
def test_disabled_adapter_is_the_base_model_bit_for_bit(make):
    lm = make()
    with torch.no_grad():
        base = score(lm)
    peft_lm = apply_lora(lm, r=4, lora_alpha=8, lora_dropout=0.05).eval()
    perturb_lora_b(peft_lm)
    with torch.no_grad():
        policy = score(peft_lm)
        with peft_lm.disable_adapter():
            reference = score(peft_lm)
    assert (policy - base).abs().max() > 1e-3  # the adapter really changes the policy
    assert torch.equal(reference, base)


def test_lora_tensors_get_nonzero_grads_from_completion_logprobs():
    peft_lm = apply_lora(tiny_qwen2(), r=4, lora_alpha=8, lora_dropout=0.0)
    perturb_lora_b(peft_lm)
    score(peft_lm).sum().backward()
    lora = {n: p for n, p in peft_lm.named_parameters() if "lora_" in n}
    assert len(lora) == 2 * 7 * 2  # A and B, 7 projections, 2 layers
    for name, p in lora.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reached {name}"


def tiny_sa2va():
    from projects.llava_sam2.rl_train.model.network.presets import build_preset
    from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
    from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

    torch.manual_seed(0)
    return Sa2VAModel(build_preset("tiny", vocab_size=len(load_tiny_tokenizer())))


def test_trainable_set_of_a_tiny_sa2va_model():
    model = tiny_sa2va()
    with pytest.raises(ValueError, match="apply_lora"):
        configure_trainable(model)
    model.language_model = apply_lora(model.language_model, r=4, lora_alpha=8)
    params = configure_trainable(model)
    assert params.keys() == trainable_parameters(model).keys()
    groups = {
        "lora": [n for n in params if "lora_" in n],
        "mlp1": [n for n in params if n.startswith("mlp1.")],
        "decoder": [n for n in params if n.startswith("grounding_encoder.sam2_model.sam_mask_decoder.")],
        "fcs": [n for n in params if n.startswith("text_hidden_fcs.")],
    }
    assert sum(map(len, groups.values())) == len(params)  # nothing else is trainable
    assert len(groups["lora"]) == 2 * 7 * model.config.llm_config.num_hidden_layers
    assert len(groups["mlp1"]) == 6 and len(groups["fcs"]) == 4
    decoder = model.grounding_encoder.sam2_model.sam_mask_decoder
    assert len(groups["decoder"]) == len(list(decoder.parameters()))
    assert not any(p.requires_grad for p in model.vision_model.parameters())
    assert not any(p.requires_grad for p in model.grounding_encoder.sam2_model.image_encoder.parameters())
    assert not model.get_input_embeddings().weight.requires_grad


def test_train_embeddings_and_checkpointing_input_grads():
    model = tiny_sa2va()
    model.language_model = apply_lora(model.language_model, r=4, lora_alpha=8)
    params = configure_trainable(model, train_embeddings=True)
    assert model.get_input_embeddings().weight.requires_grad and model.get_output_embeddings().weight.requires_grad
    assert sum("embed_tokens" in n or "lm_head" in n for n in params) == 2
    model.language_model.gradient_checkpointing_enable()
    configure_trainable(model)
    assert not model.get_input_embeddings().weight.requires_grad
    ids = torch.tensor([[3, 4, 5]])
    assert model.get_input_embeddings()(ids).requires_grad  # the hook re-enables grads at the input


def test_greedy_sampling_through_peft_follows_the_adapter_switch():
    from projects.llava_sam2.rl_train.model.decoding.generation import sample_completions

    lm = tiny_qwen2()
    embeds = lm.get_input_embeddings()(torch.randint(1, 64, (3, 5), generator=torch.Generator().manual_seed(2)))
    attention = torch.ones(3, 5, dtype=torch.long)
    kw = dict(max_new_tokens=8, do_sample=False, stop_token_ids=[999])
    with torch.no_grad():
        base = sample_completions(lm, embeds, attention, **kw).ids
        peft_lm = apply_lora(lm, r=4, lora_alpha=8, lora_dropout=0.0).eval()
        perturb_lora_b(peft_lm)
        policy = sample_completions(peft_lm, embeds, attention, **kw).ids
        with peft_lm.disable_adapter():
            reference = sample_completions(peft_lm, embeds, attention, **kw).ids
    assert torch.equal(reference, base) and not torch.equal(policy, base)


def lora_a_output_dtypes(peft_lm):
    """Record the dtype every adapter's A projection computes in (forward hooks); returns the set and the handles."""
    seen, handles = set(), []
    for name, module in peft_lm.named_modules():
        if name.endswith("lora_A.default"):
            handles.append(module.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype)))
    return seen, handles


def test_adapters_of_a_bf16_model_compute_in_bf16_under_amp_and_in_fp32_without():
    lm = apply_lora(tiny_qwen2().to(torch.bfloat16), r=4, lora_alpha=8, lora_dropout=0.0)
    perturb_lora_b(lm)
    assert {p.dtype for n, p in lm.named_parameters() if "lora_" in n} == {torch.float32}  # peft keeps fp32 masters
    seen, handles = lora_a_output_dtypes(lm)
    plain = score(lm)
    assert seen == {torch.float32}  # the old path: every adapter GEMM in fp32
    seen.clear()
    with adapter_compute_dtype(lm, torch.bfloat16):
        amp = score(lm)
    assert seen == {torch.bfloat16}
    assert all(m.cast_input_dtype_enabled for _, m in lm.named_modules() if hasattr(m, "cast_input_dtype_enabled"))
    torch.testing.assert_close(amp.float(), plain.float(), atol=0.1, rtol=0.05)  # bf16 rounding only
    assert not torch.equal(amp.float(), plain.float())
    # forward under autocast, backward outside it (as MMEngine's train_step): fp32 gradients reach the adapters
    lm.train()
    with disable_input_dtype_casting(lm):
        with adapter_compute_dtype(lm, torch.bfloat16):
            loss = -score(lm).float().sum()
        loss.backward()
    grads = [p.grad for n, p in lm.named_parameters() if "lora_A" in n]
    assert all(g is not None and g.dtype == torch.float32 and g.abs().sum() > 0 for g in grads)
    for handle in handles:
        handle.remove()


def test_adapter_compute_dtype_none_or_fp32_changes_nothing():
    lm = apply_lora(tiny_qwen2(), r=4, lora_alpha=8, lora_dropout=0.0)
    perturb_lora_b(lm)
    reference = score(lm)
    for dtype in (None, torch.float32):
        with adapter_compute_dtype(lm, dtype):
            assert not torch.is_autocast_enabled("cpu")
            assert torch.equal(score(lm), reference)
