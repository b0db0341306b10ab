"""Expected HF Sa2VA checkpoint layouts, written from docs/sa2va_internals.md §1.3-§1.8 and §9 (not from
our model code), for tests/test_model_layout.py.

Exact key sets are generated for the groups the reference spells out (InternViT, Qwen2, InternLM2,
mlp1, text_hidden_fcs, SAM2 image encoder / mask decoder / prompt encoder / small tensors); the memory
modules are checked by count plus the keys the reference names. Shapes are given for representative keys.
"""
from __future__ import annotations

VIT = "vision_model."
LM = "language_model."
SAM = "grounding_encoder.sam2_model."

# Tensor counts per top-level group (reference §1.4, §1.6, §1.7, §1.8).
VIT_300M_TENSORS = 340
SAM2_TENSORS = 900
MLP1_TENSORS = 6
TEXT_HIDDEN_FCS_TENSORS = 4
SAM2_GROUP_COUNTS = {
    "image_encoder": 594,
    "sam_mask_decoder": 131,
    "sam_prompt_encoder": 17,
    "memory_attention": 106,
    "memory_encoder": 40,
    "obj_ptr_proj": 6,
    "mask_downsample": 2,
    "maskmem_tpos_enc": 1,
    "no_mem_embed": 1,
    "no_mem_pos_enc": 1,
    "no_obj_ptr": 1,
}

# Release dims (reference §1.3): D, layers, heads, kv heads, FFN, vocab, arch.
RELEASES = {
    "1b": dict(D=896, layers=24, heads=14, kv=2, ffn=4864, vocab=151679, arch="Qwen2ForCausalLM"),
    "4b": dict(D=2048, layers=36, heads=16, kv=2, ffn=11008, vocab=151679, arch="Qwen2ForCausalLM"),
    "8b": dict(D=4096, layers=32, heads=32, kv=8, ffn=14336, vocab=92558, arch="InternLM2ForCausalLM"),
    # Sa2VA-InternVL3 (reference §9): Qwen2.5-1.5B / -7B / -14B behind the same ViT
    "in3_2b": dict(D=1536, layers=28, heads=12, kv=2, ffn=8960, vocab=151679, arch="Qwen2ForCausalLM"),
    "in3_8b": dict(D=3584, layers=28, heads=28, kv=4, ffn=18944, vocab=151679, arch="Qwen2ForCausalLM"),
    "in3_14b": dict(D=5120, layers=48, heads=40, kv=8, ffn=13824, vocab=151679, arch="Qwen2ForCausalLM"),
}


def _wb(prefix: str) -> list[str]:
    return [f"{prefix}.weight", f"{prefix}.bias"]


def vit_300m_keys() -> set[str]:
    keys = [VIT + k for k in ("embeddings.class_embedding", "embeddings.position_embedding")]
    keys += _wb(VIT + "embeddings.patch_embedding")
    for i in range(24):
        p = f"{VIT}encoder.layers.{i}."
        for sub in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2", "norm1", "norm2"):
            keys += _wb(p + sub)
        keys += [p + "ls1", p + "ls2"]
    return set(keys)


def qwen2_keys(layers: int) -> set[str]:
    keys = [LM + "model.embed_tokens.weight", LM + "model.norm.weight", LM + "lm_head.weight"]
    for i in range(layers):
        p = f"{LM}model.layers.{i}."
        for proj in "qkv":
            keys += _wb(f"{p}self_attn.{proj}_proj")
        keys += [f"{p}self_attn.o_proj.weight", f"{p}input_layernorm.weight", f"{p}post_attention_layernorm.weight"]
        keys += [f"{p}mlp.{m}_proj.weight" for m in ("gate", "up", "down")]
    return set(keys)


def internlm2_keys(layers: int) -> set[str]:
    keys = [LM + "model.tok_embeddings.weight", LM + "model.norm.weight", LM + "output.weight"]
    for i in range(layers):
        p = f"{LM}model.layers.{i}."
        keys += [p + k for k in ("attention.wqkv.weight", "attention.wo.weight", "feed_forward.w1.weight",
                                 "feed_forward.w2.weight", "feed_forward.w3.weight", "attention_norm.weight",
                                 "ffn_norm.weight")]
    return set(keys)


def projector_keys() -> set[str]:
    keys = [k for i in (0, 1, 3) for k in _wb(f"mlp1.{i}")]
    keys += [k for i in (0, 2) for k in _wb(f"text_hidden_fcs.{i}")]
    return set(keys)


def sam2_image_encoder_keys() -> set[str]:
    t = SAM + "image_encoder.trunk."
    keys = _wb(t + "patch_embed.proj") + [t + "pos_embed", t + "pos_embed_window"]
    for i in range(48):
        for sub in ("norm1", "norm2", "attn.qkv", "attn.proj", "mlp.layers.0", "mlp.layers.1"):
            keys += _wb(f"{t}blocks.{i}.{sub}")
    for i in (2, 8, 44):
        keys += _wb(f"{t}blocks.{i}.proj")
    for i in range(4):
        keys += _wb(f"{SAM}image_encoder.neck.convs.{i}.conv")
    return set(keys)


def _mlp3(prefix: str) -> list[str]:
    return [k for j in range(3) for k in _wb(f"{prefix}.layers.{j}")]


def _attn(prefix: str) -> list[str]:
    return [k for proj in ("q", "k", "v", "out") for k in _wb(f"{prefix}.{proj}_proj")]


def sam2_mask_decoder_keys() -> set[str]:
    d = SAM + "sam_mask_decoder."
    keys = [d + "iou_token.weight", d + "mask_tokens.weight", d + "obj_score_token.weight"]
    keys += [k for i in (0, 1, 3) for k in _wb(f"{d}output_upscaling.{i}")]
    keys += _wb(d + "conv_s0") + _wb(d + "conv_s1")
    keys += [k for i in range(4) for k in _mlp3(f"{d}output_hypernetworks_mlps.{i}")]
    keys += _mlp3(d + "iou_prediction_head") + _mlp3(d + "pred_obj_score_head")
    for i in range(2):
        p = f"{d}transformer.layers.{i}."
        for attn in ("self_attn", "cross_attn_token_to_image", "cross_attn_image_to_token"):
            keys += _attn(p + attn)
        keys += _wb(p + "mlp.layers.0") + _wb(p + "mlp.layers.1")
        keys += [k for n in range(1, 5) for k in _wb(f"{p}norm{n}")]
    keys += _attn(d + "transformer.final_attn_token_to_image") + _wb(d + "transformer.norm_final_attn")
    return set(keys)


def sam2_prompt_encoder_keys() -> set[str]:
    e = SAM + "sam_prompt_encoder."
    keys = [e + "pe_layer.positional_encoding_gaussian_matrix", e + "not_a_point_embed.weight",
            e + "no_mask_embed.weight"]
    keys += [f"{e}point_embeddings.{i}.weight" for i in range(4)]
    keys += [k for i in (0, 1, 3, 4, 6) for k in _wb(f"{e}mask_downscaling.{i}")]
    return set(keys)


def sam2_named_keys() -> set[str]:
    """Keys the reference names outside the fully spelled groups."""
    keys = [SAM + k for k in ("maskmem_tpos_enc", "no_mem_embed", "no_mem_pos_enc", "no_obj_ptr")]
    keys += _mlp3(SAM + "obj_ptr_proj") + _wb(SAM + "mask_downsample")
    keys += [f"{SAM}memory_encoder.fuser.layers.{i}.g_weight" for i in range(2)]
    return set(keys)


def representative_shapes(release: str) -> dict[str, tuple[int, ...]]:
    r = RELEASES[release]
    D, V, ffn, hd = r["D"], r["vocab"], r["ffn"], r["D"] // r["heads"]
    shapes = {
        VIT + "embeddings.class_embedding": (1, 1, 1024),
        VIT + "embeddings.position_embedding": (1, 1025, 1024),
        VIT + "embeddings.patch_embedding.weight": (1024, 3, 14, 14),
        VIT + "encoder.layers.0.attn.qkv.weight": (3072, 1024),
        VIT + "encoder.layers.23.attn.qkv.bias": (3072,),
        VIT + "encoder.layers.5.mlp.fc1.weight": (4096, 1024),
        VIT + "encoder.layers.5.mlp.fc2.weight": (1024, 4096),
        VIT + "encoder.layers.7.ls1": (1024,),
        "mlp1.0.weight": (4096,),
        "mlp1.1.weight": (D, 4096),
        "mlp1.3.weight": (D, D),
        "text_hidden_fcs.0.weight": (D, D),
        "text_hidden_fcs.2.weight": (256, D),
        SAM + "image_encoder.trunk.patch_embed.proj.weight": (144, 3, 7, 7),
        SAM + "image_encoder.trunk.pos_embed": (1, 144, 7, 7),
        SAM + "image_encoder.trunk.pos_embed_window": (1, 144, 8, 8),
        SAM + "image_encoder.trunk.blocks.2.proj.weight": (288, 144),
        SAM + "image_encoder.trunk.blocks.8.proj.weight": (576, 288),
        SAM + "image_encoder.trunk.blocks.44.proj.weight": (1152, 576),
        SAM + "image_encoder.neck.convs.0.conv.weight": (256, 1152, 1, 1),
        SAM + "image_encoder.neck.convs.3.conv.weight": (256, 144, 1, 1),
        SAM + "sam_prompt_encoder.pe_layer.positional_encoding_gaussian_matrix": (2, 128),
        SAM + "sam_mask_decoder.mask_tokens.weight": (4, 256),
        SAM + "sam_mask_decoder.conv_s0.weight": (32, 256, 1, 1),
        SAM + "sam_mask_decoder.conv_s1.weight": (64, 256, 1, 1),
        SAM + "sam_mask_decoder.output_upscaling.0.weight": (256, 64, 2, 2),  # ConvT(256→64): [in, out, k, k]
        SAM + "sam_mask_decoder.output_upscaling.3.weight": (64, 32, 2, 2),
        SAM + "sam_mask_decoder.output_hypernetworks_mlps.0.layers.2.weight": (32, 256),
        SAM + "sam_mask_decoder.transformer.layers.0.mlp.layers.0.weight": (2048, 256),
        SAM + "sam_mask_decoder.transformer.layers.0.cross_attn_token_to_image.q_proj.weight": (128, 256),
        SAM + "sam_mask_decoder.iou_prediction_head.layers.2.weight": (4, 256),
        SAM + "maskmem_tpos_enc": (7, 1, 1, 64),
        SAM + "no_mem_embed": (1, 1, 256),
        SAM + "no_mem_pos_enc": (1, 1, 256),
        SAM + "no_obj_ptr": (1, 256),
        SAM + "memory_encoder.fuser.layers.0.g_weight": (256,),
        SAM + "memory_attention.layers.0.cross_attn_image.k_proj.weight": (256, 64),  # kv dim 64
    }
    if r["arch"] == "Qwen2ForCausalLM":
        kv = r["kv"] * hd
        shapes.update({
            LM + "model.embed_tokens.weight": (V, D),
            LM + "lm_head.weight": (V, D),
            LM + "model.layers.0.self_attn.q_proj.weight": (D, D),
            LM + "model.layers.0.self_attn.q_proj.bias": (D,),
            LM + "model.layers.0.self_attn.k_proj.weight": (kv, D),
            LM + "model.layers.0.self_attn.v_proj.bias": (kv,),
            LM + "model.layers.0.self_attn.o_proj.weight": (D, D),
            LM + "model.layers.0.mlp.gate_proj.weight": (ffn, D),
            LM + "model.layers.0.mlp.down_proj.weight": (D, ffn),
            LM + "model.norm.weight": (D,),
        })
    else:
        shapes.update({
            LM + "model.tok_embeddings.weight": (V, D),
            LM + "output.weight": (V, D),
            LM + "model.layers.0.attention.wqkv.weight": ((r["heads"] + 2 * r["kv"]) * hd, D),
            LM + "model.layers.0.attention.wo.weight": (D, D),
            LM + "model.layers.0.feed_forward.w1.weight": (ffn, D),
            LM + "model.layers.0.feed_forward.w3.weight": (ffn, D),
            LM + "model.layers.0.feed_forward.w2.weight": (D, ffn),
            LM + "model.layers.31.ffn_norm.weight": (D,),
            LM + "model.norm.weight": (D,),
        })
    return shapes


def llm_keys(release: str) -> set[str]:
    r = RELEASES[release]
    return qwen2_keys(r["layers"]) if r["arch"] == "Qwen2ForCausalLM" else internlm2_keys(r["layers"])
