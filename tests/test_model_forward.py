"""Tiny Sa2VAModel forward: vision → mlp1 → embed_inputs → LLM → [SEG] hidden → SAM2 decoder, gradients,
region-token splicing, pixel shuffle order, InternViT attention and the mask post-processing chain."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from projects.llava_sam2.rl_train.model.network.configuration import Sa2VAConfig
from projects.llava_sam2.rl_train.model.network.grounding import no_prompt_embeddings
from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
from projects.llava_sam2.rl_train.model.network.vision import VisionAttention, pixel_shuffle
from projects.llava_sam2.rl_train.model.text.constants import IMG_CONTEXT_TOKEN, SEG_TOKEN
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tiny_tokenizer()


@pytest.fixture
def model(tokenizer):
    torch.manual_seed(0)
    m = Sa2VAModel(build_preset("tiny", vocab_size=len(tokenizer)))
    m.bind_tokenizer(tokenizer)
    return m


def prompt_ids(tokenizer, n_ctx: int) -> torch.Tensor:
    """'<img>' + <IMG_CONTEXT>·n_ctx + '</img> segment it' + [SEG] → [1, L]."""
    ids = tokenizer("<img>", add_special_tokens=False).input_ids
    ids += [tokenizer.convert_tokens_to_ids(IMG_CONTEXT_TOKEN)] * n_ctx
    ids += tokenizer("</img> Please segment the red circle. Sure,", add_special_tokens=False).input_ids
    ids += [tokenizer.convert_tokens_to_ids(SEG_TOKEN)]
    return torch.tensor([ids])


def test_shapes_through_the_whole_chain(model, tokenizer):
    cfg = model.config
    t, g, D = cfg.num_image_token, cfg.region_grid_size, cfg.llm_hidden_size
    vit = model.encode_vision(torch.randn(1, 3, 224, 224))
    assert vit.shape == (1, t, 4 * 64) == (1, 64, 256) and not vit.requires_grad
    tiles = model.project_vision(vit)
    cells = torch.zeros(1, g, g, dtype=torch.bool)
    cells[0, 2:4, 3:6] = True  # 6 region tokens
    image_embeds = model.build_image_embeds(tiles, cells)
    assert image_embeds.shape == (t + 6, D)
    ids = prompt_ids(tokenizer, t + 6)
    embeds = model.embed_inputs(ids, [image_embeds])
    out = model.language_model(inputs_embeds=embeds, output_hidden_states=True)
    assert out.logits.shape == (1, ids.shape[1], cfg.vocab_size)
    seg_hidden = out.hidden_states[-1][ids == model.seg_token_id]  # [M, D]
    prompt = model.seg_hidden_to_prompt(seg_hidden)
    assert prompt.shape == (1, 32)
    features = model.encode_grounding(torch.rand(2, 3, 256, 256) * 255)
    assert features.image_embed.shape == (2, 32, 16, 16) and not features.image_embed.requires_grad
    assert [tuple(f.shape) for f in features.high_res_feats] == [(2, 32, 64, 64), (2, 32, 32, 32)]
    dec = model.decode_masks(prompt.expand(3, -1), features, torch.tensor([0, 1, 1]))
    assert dec.low_res_logits.shape == (3, 3, 64, 64) and dec.iou_scores.shape == (3, 3)
    assert torch.equal(dec.best_index, dec.iou_scores.argmax(-1))
    assert torch.equal(dec.best_logits, dec.low_res_logits[torch.arange(3), dec.best_index])
    assert ((dec.iou_scores > 0) & (dec.iou_scores < 1)).all()  # sigmoid IoU head
    masks = model.logits_to_masks(dec.best_logits, [(40, 50), (64, 64), (7, 9)])
    assert [tuple(m.shape) for m in masks] == [(40, 50), (64, 64), (7, 9)] and masks[0].dtype == torch.bool


def test_mask_loss_reaches_mlp1_fcs_and_decoder_but_not_frozen_encoders(model, tokenizer):
    model.vision_model.requires_grad_(False)
    model.grounding_encoder.sam2_model.image_encoder.requires_grad_(False)
    t = model.num_image_token
    tiles = model.project_vision(model.encode_vision(torch.randn(1, 3, 224, 224)))
    ids = prompt_ids(tokenizer, t)
    embeds = model.embed_inputs(ids, [model.build_image_embeds(tiles)])
    hidden = model.language_model(inputs_embeds=embeds, output_hidden_states=True).hidden_states[-1]
    prompt = model.seg_hidden_to_prompt(hidden[ids == model.seg_token_id])
    features = model.encode_grounding(torch.rand(1, 3, 256, 256) * 255)
    dec = model.decode_masks(prompt, features, torch.tensor([0]))
    gt = torch.zeros(1, 64, 64)
    gt[:, 10:30, 20:50] = 1
    F.binary_cross_entropy_with_logits(dec.best_logits, gt).backward()

    def grad_norm(module_params):
        return {n: (p.grad.abs().sum().item() if p.grad is not None else 0.0) for n, p in module_params}

    for name, value in grad_norm(model.mlp1.named_parameters()).items():
        assert value > 0, f"mlp1.{name} got no gradient"
    for name, value in grad_norm(model.text_hidden_fcs.named_parameters()).items():
        assert value > 0, f"text_hidden_fcs.{name} got no gradient"
    decoder = dict(grad_norm(model.grounding_encoder.sam2_model.sam_mask_decoder.named_parameters()))
    for name in ("conv_s0.weight", "conv_s1.weight", "output_upscaling.0.weight", "mask_tokens.weight",
                 "transformer.layers.0.cross_attn_token_to_image.q_proj.weight",
                 f"output_hypernetworks_mlps.{1 + dec.best_index.item()}.layers.0.weight"):
        assert decoder[name] > 0, f"sam_mask_decoder.{name} got no gradient"
    assert all(p.grad is None for p in model.vision_model.parameters())
    assert all(p.grad is None for p in model.grounding_encoder.sam2_model.image_encoder.parameters())
    assert model.get_input_embeddings().weight.grad.abs().sum() > 0  # LLM is in the path


def test_region_tokens_are_thumbnail_tokens_at_the_cells(model):
    g, t, D = 8, 64, model.config.llm_hidden_size
    tiles = torch.randn(3, t, D)  # 2 tiles + thumbnail (last)
    cells = torch.zeros(2, g, g, dtype=torch.bool)
    cells[0, 1, 2] = cells[0, 0, 5] = cells[0, 7, 7] = True
    cells[1, 4, :2] = True
    out = model.build_image_embeds(tiles, cells)
    assert out.shape == (3 * t + 5, D)
    assert torch.equal(out[: 3 * t], tiles.reshape(3 * t, D))
    row_major = [0 * g + 5, 1 * g + 2, 7 * g + 7, 4 * g + 0, 4 * g + 1]
    assert torch.equal(out[3 * t:], tiles[-1, row_major])
    assert torch.equal(model.build_image_embeds(tiles, [c for c in cells]), out)  # list form
    with pytest.raises(ValueError, match="region_cells"):
        model.build_image_embeds(tiles, torch.zeros(1, 4, 4, dtype=torch.bool))


def test_embed_inputs_fills_context_rows_and_checks_counts(model, tokenizer):
    ctx = model.img_context_token_id
    ids = torch.tensor([[5, ctx, ctx, 7, ctx], [ctx, 9, 9, 9, 9]])
    fills = [torch.randn(3, 128), torch.randn(1, 128)]
    embeds = model.embed_inputs(ids, fills)
    table = model.get_input_embeddings().weight
    assert torch.equal(embeds[0, [1, 2, 4]], fills[0]) and torch.equal(embeds[1, 0], fills[1][0])
    assert torch.equal(embeds[0, 3], table[7]) and torch.equal(embeds[1, 1:], table[[9, 9, 9, 9]])
    with pytest.raises(ValueError, match=r"sample 0: input_ids hold 3 <IMG_CONTEXT> tokens but image_embeds\[0\] has 2"):
        model.embed_inputs(ids, [torch.randn(2, 128), fills[1]])
    with pytest.raises(ValueError, match="sample 1: input_ids hold 1"):
        model.embed_inputs(ids, [fills[0], None])
    with pytest.raises(ValueError, match="2 image_embeds entries for a batch of 3"):
        model.embed_inputs(torch.cat([ids, ids[:1]]), fills)


def test_bind_tokenizer_rejects_a_larger_vocabulary(tokenizer):
    small = Sa2VAModel(build_preset("tiny", vocab_size=len(tokenizer) - 1))
    with pytest.raises(ValueError, match=f"tokenizer has {len(tokenizer)} tokens"):
        small.bind_tokenizer(tokenizer)
    with pytest.raises(ValueError, match="bind_tokenizer"):
        small.embed_inputs(torch.tensor([[1]]), [None])


def test_pixel_shuffle_block_order_and_v1_transpose():
    grid = torch.arange(16.0).reshape(1, 4, 4, 1)  # value = 4·row + col
    v2 = pixel_shuffle(grid, 0.5, "v2")
    assert v2.shape == (1, 2, 2, 4)
    assert v2[0, 0, 1].tolist() == [2, 3, 6, 7]  # block (row 0, col 1): (0,0) (0,1) (1,0) (1,1)
    assert v2[0, 1, 0].tolist() == [8, 9, 12, 13]
    assert torch.equal(pixel_shuffle(grid, 0.5, "v1"), v2.transpose(1, 2))


def test_internvit_attention_with_qk_norm_matches_the_reference_formula():
    cfg = build_preset("tiny", vocab_size=64).to_dict()["vision_config"]
    cfg.update(qk_normalization=True, qkv_bias=False, norm_type="rms_norm")
    vit_cfg = Sa2VAConfig.from_dict({**build_preset("tiny", vocab_size=64).to_dict(), "vision_config": cfg})
    attn = VisionAttention(vit_cfg.vision_config)
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)
        attn.k_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, 64)
    # Reference: qkv → (B, N, 3, heads, d); q, k RMS-normalised over all heads' channels at once.
    qkv = attn.qkv(x).reshape(2, 5, 3, 4, 16)
    q, k, v = qkv.unbind(2)

    def rms(t, w):
        flat = t.reshape(2, 5, 64)
        return (w * flat / torch.sqrt(flat.pow(2).mean(-1, keepdim=True) + 1e-6)).reshape(2, 5, 4, 16)

    q, k = rms(q, attn.q_norm.weight), rms(k, attn.k_norm.weight)
    weights = torch.einsum("bnhd,bmhd->bhnm", q, k).mul(16**-0.5).softmax(-1)
    expected = attn.proj(torch.einsum("bhnm,bmhd->bnhd", weights, v).reshape(2, 5, 64))
    assert torch.allclose(attn(x), expected, atol=1e-5)
    assert attn.q_norm.weight.shape == (64,)


def test_select_layer_picks_the_hidden_state(model):
    pixels = torch.randn(1, 3, 224, 224)
    vit = model.vision_model
    last = vit(pixels, select_layer=-1)
    assert torch.equal(vit(pixels, select_layer=2), last)
    assert torch.equal(vit(pixels, select_layer=0), vit.embeddings(pixels))
    assert not torch.allclose(vit(pixels, select_layer=-2), last)


def test_no_prompt_embeddings_equal_the_prompt_encoder(model):
    sam = model.grounding_encoder.sam2_model
    with torch.no_grad():
        sam.sam_prompt_encoder.not_a_point_embed.weight.normal_()
    points = (torch.zeros(3, 1, 2), -torch.ones(3, 1, dtype=torch.int32))
    sparse_ref, dense_ref = sam.sam_prompt_encoder(points=points, boxes=None, masks=None)
    sparse, dense = no_prompt_embeddings(sam, 3)
    assert torch.equal(sparse, sparse_ref) and torch.equal(dense, dense_ref)


def test_grounding_normalisation_and_bad_shapes(model):
    enc = model.grounding_encoder
    mean_image = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1).expand(1, 3, 4, 4) * 255
    assert enc.preprocess(mean_image).abs().max() < 1e-5
    with pytest.raises(ValueError, match=r"\[B, 3, 256, 256\]"):
        model.encode_grounding(torch.zeros(1, 3, 128, 128))
    features = model.encode_grounding(torch.zeros(1, 3, 256, 256))
    with pytest.raises(ValueError, match="out of range"):
        model.decode_masks(torch.zeros(1, 32), features, torch.tensor([1]))
    empty = model.decode_masks(torch.zeros(0, 32), features, torch.zeros(0, dtype=torch.long))  # no [SEG] at all
    assert empty.low_res_logits.shape == (0, 3, 64, 64) and empty.best_logits.shape == (0, 64, 64)
    assert model.logits_to_masks(empty.best_logits, []) == []


def test_logits_to_masks_follows_the_bilinear_chain(model):
    logits = torch.full((1, 64, 64), -5.0)
    logits[:, :, :32] = 5.0  # left half positive
    mask = model.logits_to_masks(logits, [(30, 40)])[0]
    assert mask[:, :20].all() and not mask[:, 20:].any()
    up = F.interpolate(logits[None], size=(256, 256), mode="bilinear", align_corners=False)
    ref = F.interpolate(up, size=(30, 40), mode="bilinear", align_corners=False)[0, 0].sigmoid() > 0.5
    assert torch.equal(mask, ref)


def test_bf16_model_runs_the_grounding_chain_without_autocast(model):
    pixels, prompt = torch.rand(1, 3, 256, 256) * 255, torch.randn(2, 32)
    with torch.no_grad():
        ref = model.decode_masks(prompt, model.encode_grounding(pixels), torch.tensor([0, 0]))
        model.to(torch.bfloat16)
        features = model.encode_grounding(pixels)
        out = model.decode_masks(prompt, features, torch.tensor([0, 0]))
    assert features.image_embed.dtype == torch.bfloat16 and out.low_res_logits.dtype == torch.float32
    scale = ref.low_res_logits.abs().max()
    assert (out.low_res_logits - ref.low_res_logits).abs().max() < 0.1 * scale
