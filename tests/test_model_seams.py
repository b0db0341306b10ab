"""Canaries for the transformers, torch and sam2 internals that layers below engine/ rely on
(model/network/transformers_seams.py, model/network/torch_seams.py, model/network/sam2_seams.py), and for the public replacement of torch's private dropout base class (grpo/trainer.py).

Each test names the installed version and what changed when an upgrade breaks an assumption.
"""
import pytest
import torch
import transformers
from torch import nn
from transformers import (DynamicCache, LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from projects.llava_sam2.rl_train.grpo.trainer import DROPOUT_TYPES, zero_dropout
from projects.llava_sam2.rl_train.model.network.sam2_seams import (
    ENCODE_MEMORY_METHOD, MEMORY_CONDITIONED_METHOD, SAM2_VERSION, encode_memory, memory_conditioned_embed)
from projects.llava_sam2.rl_train.model.network.torch_seams import foreach_copy_, foreach_lerp_, mark_sizes_symbolic, \
    without_ddp_graph_splits
from projects.llava_sam2.rl_train.model.network.transformers_seams import (attention_implementation, cache_tensors,
                                                                   full_static_cache,
                                                                   has_input_require_grads_hook, run_decoder_layer,
                                                                   LAYER_CACHE_KEYWORD, select_cache_rows,
                                                                   set_attention_implementation, using_attention)

TRANSFORMERS = f"transformers {transformers.__version__}"
TORCH = f"torch {torch.__version__}"
SIZES = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
ARCHITECTURES = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM),
                 "phi3": (Phi3Config, Phi3ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}


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


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_cache_seams_read_select_and_allocate_the_layers_key_value_tensors(arch):
    lm = tiny_lm(arch)
    hd, n_kv = head_dim(lm.config), SIZES["num_key_value_heads"]
    cache = DynamicCache()
    with torch.no_grad():
        lm(torch.tensor([[1, 2, 3], [4, 5, 6]]), past_key_values=cache, use_cache=True)
    layers = cache_tensors(cache)
    assert len(layers) == SIZES["num_hidden_layers"] and all(
        k.shape == v.shape == (2, n_kv, 3, hd) for k, v in layers), (
        f"{TRANSFORMERS}: a filled DynamicCache no longer keeps [B, Hkv, L, hd] keys/values per layer in "
        "cache.layers[i].keys/values; transformers_seams.cache_tensors (fast_generation's prefix copy) must read them "
        "elsewhere.")
    first_key = layers[0][0].clone()
    select_cache_rows(cache, torch.tensor([1, 1, 0]))
    assert torch.equal(cache_tensors(cache)[0][0], first_key[[1, 1, 0]]), (
        f"{TRANSFORMERS}: Cache.reorder_cache no longer selects batch rows (transformers_seams.select_cache_rows).")
    static = full_static_cache(SIZES["num_hidden_layers"], rows=3, slots=8, like=first_key)
    storage = cache_tensors(static)
    assert all(k.shape == (3, n_kv, 8, hd) and k.dtype == first_key.dtype and not k.any() for k, _ in storage)
    key, value = torch.randn(3, n_kv, 2, hd), torch.randn(3, n_kv, 2, hd)
    returned_key, _ = static.update(key, value, 0, {"cache_position": torch.tensor([5, 6])})
    assert returned_key is storage[0][0] and torch.equal(storage[0][0][:, :, 5:7], key) and \
        torch.equal(storage[0][1][:, :, 5:7], value), (
            f"{TRANSFORMERS}: a StaticLayer no longer writes into (and returns) the tensors allocated by "
            "early_initialization at the cache_position slots; fast_generation's static cache (full_static_cache, "
            "graph-captured addresses) relies on it.")
    # under autocast the keys leave RoPE in float32 and the values come in bfloat16: both are stored in its dtype
    half_value = torch.randn(3, n_kv, 1, hd).bfloat16()
    static.update(key[:, :, :1], half_value, 0, {"cache_position": torch.tensor([7])})
    assert storage[0][1].dtype == first_key.dtype and torch.equal(storage[0][1][:, :, 7:8], half_value.float())


def head_dim(config) -> int:
    """Qwen3 configs name the head size; the others derive it from the hidden size."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class RecordingStore:
    """A key/value store in place of a transformers Cache: records each update and returns it unchanged."""

    def __init__(self):
        self.updates = []

    def update(self, key, value, layer_idx, cache_kwargs=None):
        self.updates.append(key.shape)
        return key, value


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_run_decoder_layer_uses_the_given_store_in_train_mode_and_returns_the_hidden_states(arch):
    lm = tiny_lm(arch)
    body = lm.get_decoder()
    hidden = torch.randn(2, 3, SIZES["hidden_size"])
    positions = torch.arange(3)[None].expand(2, 3)
    kwargs = dict(attention_mask=None, position_ids=positions, cache_position=torch.arange(3),
                  position_embeddings=body.rotary_emb(hidden, positions))
    with torch.no_grad():
        expected = run_decoder_layer(body.layers[0], hidden, RecordingStore(), use_cache=True, **kwargs)
    assert isinstance(expected, torch.Tensor) and expected.shape == hidden.shape, (
        f"{TRANSFORMERS}: a decoder layer no longer returns its hidden states as one tensor; "
        "transformers_seams.run_decoder_layer must unpack the new output.")
    lm.gradient_checkpointing_enable()
    lm.train()  # transformers' own per-layer wrapper would drop the store here
    store = RecordingStore()
    output = run_decoder_layer(body.layers[0], hidden, store, use_cache=True, **kwargs)
    assert store.updates == [(2, SIZES["num_key_value_heads"], 3, head_dim(lm.config))], (
        f"{TRANSFORMERS}: the decoder layer did not pass its keys to the store given as "
        f"{LAYER_CACHE_KEYWORD!r} in train mode with gradient checkpointing; grouped scoring's GroupKV would be "
        "bypassed (transformers_seams.run_decoder_layer).")
    assert torch.equal(output, expected)


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


def test_marked_sizes_are_separate_symbols_of_the_first_trace():
    """Two marked sizes, equal on the first call and not on the second: one graph serves both (each size its own
    symbol, not one shared symbol guarded equal). Unmarked, the second call compiles again (the mark is live)."""
    def compiled_graphs(mark: bool) -> int:
        graphs = []

        def counting_backend(graph_module, example_inputs):
            graphs.append(graph_module)
            return graph_module.forward

        step = torch.compile(lambda x, y: x.sum(0) * 2 + y.mean(), backend=counting_backend)
        for rows, length in ((4, 4), (7, 5)):
            x, y = torch.ones(rows, 3), torch.ones(length)
            if mark:
                mark_sizes_symbolic(x, [0])
                mark_sizes_symbolic(y, [0])
            torch.testing.assert_close(step(x, y), torch.full((3,), 2.0 * rows + 1))
        return len(graphs)

    torch.compiler.reset()
    assert compiled_graphs(mark=True) == 1, (
        f"{TORCH}: sizes marked by torch._dynamo.maybe_mark_dynamic are no longer separate symbols of the first "
        "trace; the compiled decode step recompiles per shape (torch_seams.mark_sizes_symbolic)")
    torch.compiler.reset()
    assert compiled_graphs(mark=False) == 2, f"{TORCH}: an unmarked size change no longer recompiles"
    torch.compiler.reset()


def test_ddp_graph_splitting_is_switched_off_inside_the_block_only():
    before = torch._dynamo.config.optimize_ddp
    with without_ddp_graph_splits():
        assert torch._dynamo.config.optimize_ddp is False, (
            f"{TORCH}: torch._dynamo.config.optimize_ddp no longer switches Dynamo's DDP optimizer "
            "(torch_seams.without_ddp_graph_splits)")
    assert torch._dynamo.config.optimize_ddp == before


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
