"""model/sft/sft_loss.py: point sampling and loss formulas on tensors, then the full loss on the tiny model."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from projects.llava_sam2.rl_train.model.sft.sft_loss import (
    llm_loss, mask_bce_loss, mask_dice_loss, mask_losses, point_sample, resize_gt_masks,
    sample_uncertain_points)


def test_point_sample_hits_pixel_centres():
    values = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])  # [1, 2, 2]
    # align_corners=False: pixel (row i, col j) has its centre at x=(j+0.5)/w, y=(i+0.5)/h
    coords = torch.tensor([[[0.25, 0.25], [0.75, 0.25], [0.25, 0.75], [0.75, 0.75], [0.5, 0.25]]])
    assert point_sample(values, coords).tolist() == [[1.0, 2.0, 3.0, 4.0, 1.5]]


def test_uncertain_points_are_the_top_candidates_plus_fresh_ones():
    logits = torch.randn(2, 8, 8) * 4
    P, ratio = 20, 3.0
    coords = sample_uncertain_points(logits, P, ratio, 0.75, torch.Generator().manual_seed(0))
    assert coords.shape == (2, P, 2) and coords.min() >= 0 and coords.max() <= 1
    candidates = torch.rand(2, int(P * ratio), 2, generator=torch.Generator().manual_seed(0))  # same draw
    uncertainty = -point_sample(logits, candidates).abs()  # [2, 60]
    n_unc = int(0.75 * P)  # 15 importance points, 5 fresh uniform ones
    for m in range(2):
        expected = candidates[m, uncertainty[m].topk(n_unc).indices]
        assert torch.equal(coords[m, :n_unc], expected)
        fresh_in_candidates = (coords[m, n_unc:, None] == candidates[m][None]).all(-1).any(-1)
        assert not fresh_in_candidates.any()


def test_uncertain_points_concentrate_on_the_decision_boundary():
    logits = torch.full((1, 32, 32), 20.0)
    logits[:, :, :8] = 0.0  # only the left quarter is uncertain
    coords = sample_uncertain_points(logits, 400, 3.0, 0.75, torch.Generator().manual_seed(1))
    assert (coords[0, :300, 0] < 0.25 + 1 / 64).float().mean() > 0.95  # importance part
    assert (coords[0, 300:, 0] > 0.3).any()  # the uniform part still covers the rest


def test_bce_and_dice_worked_example():
    x = torch.tensor([[0.0, 0.0]])  # p = sigmoid(0) = 0.5 at both points
    t = torch.tensor([[1.0, 0.0]])
    # BCE = ln 2 per point; Σ = 2 ln 2; / (M·P + 1e-4) = / 2.0001; × 2.0
    assert mask_bce_loss(x, t).item() == pytest.approx(2.0 * 2 * math.log(2) / 2.0001, rel=1e-6)
    # Σpt = 0.5, Σp = 1, Σt = 1 → dice = (2·0.5 + 1) / (1 + 1 + 1) = 2/3; loss = 0.5 · (1/3) / 1.0001
    assert mask_dice_loss(x, t).item() == pytest.approx(0.5 * (1 / 3) / 1.0001, rel=1e-6)


def test_resize_gt_masks_is_nearest_top_left_sampling():
    gt = torch.zeros(1, 4, 4, dtype=torch.uint8)
    gt[0, 0, 0] = 1  # top-left pixel of the top-left 2x2 block
    gt[0, 3, 3] = 1  # bottom-right pixel of the bottom-right block: not sampled by nearest
    other = torch.ones(2, 6, 6, dtype=torch.uint8)
    out = resize_gt_masks([gt, other], (2, 2))
    assert out.shape == (3, 2, 2) and out.dtype == torch.float32
    assert out[0].tolist() == [[1.0, 0.0], [0.0, 0.0]] and bool((out[1:] == 1).all())


def test_mask_losses_rank_predictions_and_reach_the_logits():
    gt = torch.zeros(2, 16, 16)
    gt[0, 4:12, 4:12] = 1
    gt[1, :, :5] = 1
    good = ((gt * 2 - 1) * 12).requires_grad_(True)
    bad = -good.detach()
    kw = dict(num_points=64, generator=torch.Generator().manual_seed(0))
    good_mask, good_dice = mask_losses(good, gt, **kw)
    bad_mask, bad_dice = mask_losses(bad, gt, **kw)
    # importance points sit on the boundary, where bilinear logits are ~0, so "good" is not ~0
    assert good_mask * 5 < bad_mask and good_dice * 5 < bad_dice
    (good_mask + good_dice).backward()
    assert good.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="resize the GT"):
        mask_losses(good, gt[:, :8], **kw)


def test_llm_loss_equals_shifted_cross_entropy_with_ignore_index():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11)
    hidden = torch.randn(2, 5, 8)
    labels = torch.tensor([[-100, -100, 3, 4, -100], [-100, 7, 1, -100, -100]])
    reference = F.cross_entropy(head(hidden)[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(llm_loss(head, hidden, labels), reference)
    with pytest.raises(ValueError, match="no supervised token"):
        llm_loss(head, hidden, torch.full_like(labels, -100))


# ---------------------------------------------------------------------------- tiny Sa2VA end to end


@pytest.fixture(scope="module")
def tiny():
    from projects.llava_sam2.rl_train.model.network.lora import apply_lora, configure_trainable
    from projects.llava_sam2.rl_train.model.network.presets import build_preset
    from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
    from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
    from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

    tok = load_tiny_tokenizer()
    torch.manual_seed(0)
    model = Sa2VAModel(build_preset("tiny", vocab_size=len(tok)))
    model.bind_tokenizer(tok)
    model.language_model = apply_lora(model.language_model, r=4, lora_alpha=8, lora_dropout=0.0)
    configure_trainable(model)
    with torch.no_grad():  # B = 0 would leave lora_A without gradient; give the adapter a value
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model, Sa2VAProcessor.from_config(tok, model.config)


def _image(seed, size=(40, 56)):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8))


def _box(size, r0, r1, c0, c1):
    m = np.zeros(size, dtype=np.uint8)
    m[r0:r1, c0:c1] = 1
    return m


def _seg_item(proc, seed, expressions, boxes):
    image = _image(seed)
    inputs = proc.preprocess_image(image)
    turns = [{"input": proc.segment_text(inputs.n_tiles, e) if i == 0 else e, "output": "It is [SEG]."}
             for i, e in enumerate(expressions)]
    enc = proc.encode_fn({"conversation": turns}, max_length=2048)
    masks = torch.as_tensor(np.stack([_box(inputs.size, *b) for b in boxes]))
    return dict(enc, pixel_values=inputs.pixel_values, g_pixel_values=inputs.g_pixel_values, masks=masks)


def _caption_item(proc, seed):
    image = _image(seed)
    inputs = proc.preprocess_image(image)
    cells = proc.region_cells(_box(inputs.size, 5, 30, 10, 40))
    turns = [{"input": proc.caption_text(inputs.n_tiles, cells), "output": "a red square"}]
    enc = proc.encode_fn({"conversation": turns}, max_length=2048)
    vp = torch.zeros(inputs.n_tiles, dtype=torch.bool)
    vp[-1] = True
    return dict(enc, pixel_values=inputs.pixel_values, vp_overall_mask=vp, prompt_masks=cells[None])


def _batch(proc, with_caption=True):
    from projects.llava_sam2.rl_train.model.text.processor import sft_collate

    items = [_seg_item(proc, 1, ["the cat", "the dog"], [(0, 20, 0, 28), (20, 40, 28, 56)])]
    if with_caption:
        items.append(_caption_item(proc, 2))
    items.append(_seg_item(proc, 3, ["the sky"], [(0, 10, 0, 56)]))
    return sft_collate(items)


def test_sft_loss_matches_hf_lm_loss_and_is_deterministic(tiny):
    from projects.llava_sam2.rl_train.model.sft.sft_loss import _image_embeds, sft_loss

    model, proc = tiny
    batch = _batch(proc)
    out = sft_loss(model, batch, num_points=256, generator=torch.Generator().manual_seed(0))
    again = sft_loss(model, batch["data"], num_points=256, generator=torch.Generator().manual_seed(0))
    assert set(out) == {"llm_loss", "loss_mask", "loss_dice"}
    for key in out:
        assert torch.isfinite(out[key]) and out[key] > 0, key
        assert torch.equal(out[key], again[key]), key
    data = batch["data"]
    with torch.no_grad():  # transformers' own shifted-CE loss on the same embeddings
        embeds = model.embed_inputs(data["input_ids"], _image_embeds(model, data))
        hf = model.language_model(inputs_embeds=embeds, attention_mask=data["attention_mask"].long(),
                                  position_ids=data["position_ids"], labels=data["labels"]).loss
    torch.testing.assert_close(out["llm_loss"].detach(), hf, atol=1e-5, rtol=1e-5)


def test_sft_loss_gradients_reach_every_trainable_group(tiny):
    from projects.llava_sam2.rl_train.model.network.lora import trainable_parameters
    from projects.llava_sam2.rl_train.model.sft.sft_loss import sft_loss

    model, proc = tiny
    model.zero_grad(set_to_none=True)
    out = sft_loss(model, _batch(proc), num_points=256, generator=torch.Generator().manual_seed(0))
    sum(out.values()).backward()
    params = trainable_parameters(model)
    nonzero = {n for n, p in params.items() if p.grad is not None and p.grad.abs().sum() > 0}
    missing = {n for n, p in params.items() if p.grad is None}
    assert not missing, f"no gradient at all: {sorted(missing)[:5]}"
    for group in ["lora_A", "lora_B", "mlp1.", "text_hidden_fcs.", "sam_mask_decoder.transformer.",
                  "sam_mask_decoder.conv_s0", "sam_mask_decoder.conv_s1", "sam_mask_decoder.output_upscaling"]:
        names = [n for n in params if group in n]
        assert names and all(n in nonzero for n in names), f"zero gradient in {group}: " \
            f"{[n for n in names if n not in nonzero][:3]}"
    model.zero_grad(set_to_none=True)


def test_sft_loss_without_masks_zeroes_mask_losses_but_keeps_grads(tiny):
    from projects.llava_sam2.rl_train.model.sft.sft_loss import sft_loss
    from projects.llava_sam2.rl_train.model.text.processor import sft_collate

    model, proc = tiny
    model.zero_grad(set_to_none=True)
    out = sft_loss(model, sft_collate([_caption_item(proc, 4)]))
    assert out["loss_mask"].item() == 0.0 and out["loss_dice"].item() == 0.0 and out["llm_loss"] > 0
    sum(out.values()).backward()
    assert model.text_hidden_fcs[0].weight.grad is not None
    assert model.grounding_encoder.sam2_model.sam_mask_decoder.conv_s0.weight.grad is not None
    assert model.mlp1[1].weight.grad.abs().sum() > 0  # the caption's LM loss reaches the projector
    model.zero_grad(set_to_none=True)


def test_sft_loss_rejects_seg_mask_count_mismatch(tiny):
    from projects.llava_sam2.rl_train.model.sft.sft_loss import sft_loss
    from projects.llava_sam2.rl_train.model.text.processor import sft_collate

    model, proc = tiny
    item = _seg_item(proc, 5, ["the cat", "the dog"], [(0, 20, 0, 28), (20, 40, 28, 56)])
    item["masks"] = item["masks"][:1]
    with pytest.raises(ValueError, match="2 \\[SEG\\] tokens but 1 GT"):
        sft_loss(model, sft_collate([item]), num_points=16)


def test_iou_head_loss_targets_each_output():
    from projects.llava_sam2.rl_train.model.sft.sft_loss import iou_head_loss

    gt = torch.zeros(1, 4, 4)
    gt[0, :2, :2] = 1  # 4 GT pixels
    logits = -torch.ones(1, 3, 4, 4)
    logits[0, 0, :2, :2] = 1  # output 0: exact -> IoU 1
    logits[0, 1, :2, :] = 1  # output 1: 8 pixels -> IoU 4/8; output 2 empty -> IoU 0
    assert iou_head_loss(logits, torch.tensor([[1.0, 0.5, 0.0]]), gt).item() == pytest.approx(0.0)
    scores = torch.tensor([[0.0, 0.5, 0.0]], requires_grad=True)
    loss = iou_head_loss(logits, scores, gt)
    assert loss.item() == pytest.approx(1 / 3)  # (1 - 0)^2 / 3
    loss.backward()
    assert scores.grad[0, 0] < 0
    empty = iou_head_loss(-torch.ones(1, 1, 4, 4), torch.tensor([[1.0]]), torch.zeros(1, 4, 4))
    assert empty.item() == 0.0  # both empty: IoU 1
    with pytest.raises(ValueError, match="resize the GT"):
        iou_head_loss(logits, scores, gt[:, :2])


def test_llm_loss_token_weights_are_a_weighted_mean():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11)
    hidden = torch.randn(1, 4, 8)
    labels = torch.tensor([[-100, 3, 4, 5]])
    ce = F.cross_entropy(head(hidden)[0, :-1], labels[0, 1:], reduction="none")  # [3]
    weights = torch.tensor([[1.0, 0.0, 0.5]])  # position 1's prediction (label 4) dropped
    expected = (ce[0] + 0.5 * ce[2]) / 1.5
    torch.testing.assert_close(llm_loss(head, hidden, labels, weights), expected)


def test_seg_lm_weight_drops_the_token_after_seg_and_iou_weight_adds_a_trained_head(tiny):
    from projects.llava_sam2.rl_train.model.sft.sft_loss import sft_forward, sft_loss

    model, proc = tiny
    batch = _batch(proc)
    kw = dict(num_points=64, generator=torch.Generator().manual_seed(0))
    base = sft_loss(model, batch, **kw)
    kw["generator"] = torch.Generator().manual_seed(0)
    dropped, seg = sft_forward(model, batch, seg_lm_weight=0.0, iou_loss_weight=2.0, **kw)
    data = batch["data"]
    labels = data["labels"].clone()  # the same loss by hand: ignore every label whose input is [SEG]
    after_seg = torch.zeros_like(labels, dtype=torch.bool)
    after_seg[:, 1:] = data["input_ids"][:, :-1] == model.seg_token_id
    assert int(after_seg.sum()) == 3  # three [SEG] answers, each followed by '.'
    labels[after_seg] = -100
    masked = sft_loss(model, {**data, "labels": labels}, num_points=64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(dropped["llm_loss"], masked["llm_loss"])
    assert not torch.isclose(dropped["llm_loss"], base["llm_loss"])
    torch.testing.assert_close(dropped["loss_mask"], base["loss_mask"])
    assert set(dropped) == {"llm_loss", "loss_mask", "loss_dice", "loss_iou"} and dropped["loss_iou"] > 0
    assert seg.seg_hidden.shape == (3, model.config.llm_hidden_size) and seg.seg_rows.tolist() == [0, 0, 2]
    assert seg.prompt.shape[0] == seg.gt_mask.shape[0] == seg.decoder.low_res_logits.shape[0] == 3
    model.zero_grad(set_to_none=True)
    dropped["loss_iou"].backward()
    head = model.grounding_encoder.sam2_model.sam_mask_decoder.iou_prediction_head
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())
    model.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match="must be >= 0"):
        sft_loss(model, batch, seg_lm_weight=-1.0)
