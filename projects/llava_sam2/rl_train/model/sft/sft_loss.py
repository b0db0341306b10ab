"""The upstream Sa2VA SFT loss as plain functions (docs/sa2va_internals.md §7.1), plus two opt-in terms.

``total = llm_loss + loss_mask + loss_dice`` (+ ``loss_iou`` when asked):

* ``llm_loss``: token cross-entropy, mean over supervised tokens (``labels != -100``); with ``seg_lm_weight``
  ≠ 1 a weighted mean Σ w·CE / Σ w, where w = ``seg_lm_weight`` on the token predicted from a ``[SEG]``
  input (its next token, always '.' in Sa2VA's answers) and 1 elsewhere. Default 1: upstream's loss.
* ``loss_mask``: 2.0 · Σ BCE-with-logits over sampled points / (M · P + 1e-4).
* ``loss_dice``: 0.5 · Σ_m [1 − (2 Σ p·t + 1) / (Σ p + Σ t + 1)] / (M + 1e-4), p = sigmoid.
* ``loss_iou`` (``iou_loss_weight`` > 0; not in upstream's SFT loss): SAM's IoU-prediction loss (Kirillov et
  al. 2023, §3), w · mean_{m,k} (iou_scores[m, k] − IoU(logits[m, k] > 0, gt_m))², over the 3 multimask
  outputs. Sa2VA picks the output with the highest *predicted* IoU, and its SFT never trains that head (the
  released model inherits it from SAM2); a model trained from random init needs it, or its argmax flips to
  untrained outputs.

Points are PointRend importance samples (Kirillov et al. 2020, §3.1) on the low-res mask logits:
draw ``oversample_ratio · P`` uniform points, keep the ``importance_sample_ratio · P`` most
uncertain (uncertainty = −|logit|), add fresh uniform points up to P, then bilinear-sample the
logits and the nearest-resized GT there (``grid_sample``, ``align_corners=False``). The ``+1e-4`` in
the denominators is upstream's ``avg_factor``. M = masks, P = points per mask, h×w = low-res size.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..decoding.generation import decoder_and_head  # the same body/head split as the RL scoring forward
from ..text.constants import IGNORE_INDEX

LOSS_MASK_WEIGHT = 2.0
LOSS_DICE_WEIGHT = 0.5
NUM_POINTS = 12544  # upstream value for 256x256 logits (= 112²)


def point_sample(values: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """Bilinear samples of ``values [M, h, w]`` at ``coords [M, P, 2]`` (x, y in [0, 1]) → ``[M, P]``."""
    grid = (2.0 * coords - 1.0)[:, :, None]  # [M, P, 1, 2] in [-1, 1]
    sampled = F.grid_sample(values[:, None].float(), grid.float(), align_corners=False)  # [M, 1, P, 1]
    return sampled[:, 0, :, 0]  # [M, P]


@torch.no_grad()
def sample_uncertain_points(
    logits: torch.Tensor,
    num_points: int,
    oversample_ratio: float = 3.0,
    importance_sample_ratio: float = 0.75,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """PointRend training points for mask logits ``[M, h, w]`` → coords ``[M, P, 2]`` in [0, 1].

    ``int(P · oversample_ratio)`` uniform candidates; the ``int(importance_sample_ratio · P)`` with
    the largest −|logit| (bilinear at the candidate) are kept; the rest are fresh uniform points.
    ``generator`` (optional) must live on ``logits.device``.
    """
    if num_points < 1 or oversample_ratio < 1 or not 0 <= importance_sample_ratio <= 1:
        raise ValueError(
            f"sample_uncertain_points: need num_points >= 1, oversample_ratio >= 1, 0 <= "
            f"importance_sample_ratio <= 1; got {num_points}, {oversample_ratio}, {importance_sample_ratio}."
        )
    M = logits.shape[0]
    kw = dict(device=logits.device, generator=generator)
    candidates = torch.rand(M, int(num_points * oversample_ratio), 2, **kw)  # [M, P·r, 2]
    uncertainty = -point_sample(logits, candidates).abs()  # [M, P·r]
    num_uncertain = int(importance_sample_ratio * num_points)
    top = uncertainty.topk(num_uncertain, dim=1).indices  # [M, P_u]
    uncertain = candidates.gather(1, top[..., None].expand(-1, -1, 2))  # [M, P_u, 2]
    fresh = torch.rand(M, num_points - num_uncertain, 2, **kw)  # [M, P - P_u, 2]
    return torch.cat([uncertain, fresh], dim=1)  # [M, P, 2]


def mask_bce_loss(point_logits: torch.Tensor, point_targets: torch.Tensor,
                  weight: float = LOSS_MASK_WEIGHT) -> torch.Tensor:
    """``weight · Σ BCE_with_logits(x, t) / (M · P + 1e-4)`` over ``[M, P]`` point values."""
    M, P = point_logits.shape
    bce = F.binary_cross_entropy_with_logits(point_logits, point_targets, reduction="sum")
    return weight * bce / (M * P + 1e-4)


def dice_terms(point_logits: torch.Tensor, point_targets: torch.Tensor, eps: float = 1.0) -> torch.Tensor:
    """Per mask ``1 − (2 Σ p t + eps) / (Σ p + Σ t + eps)`` ``[M]``, p = sigmoid(x) over its ``[M, P]`` points."""
    p = point_logits.sigmoid()  # [M, P]
    dice = (2 * (p * point_targets).sum(-1) + eps) / (p.sum(-1) + point_targets.sum(-1) + eps)  # [M]
    return 1 - dice


def mask_dice_loss(point_logits: torch.Tensor, point_targets: torch.Tensor,
                   weight: float = LOSS_DICE_WEIGHT, eps: float = 1.0) -> torch.Tensor:
    """``weight · Σ_m [1 − (2 Σ p t + eps) / (Σ p + Σ t + eps)] / (M + 1e-4)``, p = sigmoid(x) (naive Dice)."""
    M = point_logits.shape[0]
    return weight * dice_terms(point_logits, point_targets, eps).sum() / (M + 1e-4)


def resize_gt_masks(gt_masks: list[torch.Tensor], size: tuple[int, int]) -> torch.Tensor:
    """Nearest-resize each ``[n_i, H_i, W_i]`` GT stack to the low-res logits size → ``[Σ n_i, h, w]`` float."""
    resized = [F.interpolate(m[None].float(), size=size, mode="nearest")[0] for m in gt_masks]  # [n_i, h, w]
    return torch.cat(resized, dim=0)


def mask_losses(
    pred_logits: torch.Tensor,
    gt_mask: torch.Tensor,
    *,
    num_points: int = NUM_POINTS,
    oversample_ratio: float = 3.0,
    importance_sample_ratio: float = 0.75,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss_mask, loss_dice)`` of low-res logits ``[M, h, w]`` against GT ``[M, h, w]`` (0/1, same size)."""
    point_logits, point_targets = _point_pairs("mask_losses", pred_logits, gt_mask, num_points, oversample_ratio,
                                               importance_sample_ratio, generator)  # [M, P] each
    return mask_bce_loss(point_logits, point_targets), mask_dice_loss(point_logits, point_targets)


def _point_pairs(where: str, pred_logits: torch.Tensor, gt_mask: torch.Tensor, num_points: int,
                 oversample_ratio: float, importance_sample_ratio: float, generator: torch.Generator | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and GT ``[M, P]`` at the PointRend points of ``pred_logits``; ``where`` names the caller in errors."""
    if pred_logits.shape != gt_mask.shape:
        raise ValueError(
            f"{where}: predicted logits {tuple(pred_logits.shape)} and GT masks {tuple(gt_mask.shape)} "
            "differ; resize the GT to the logits size first (resize_gt_masks)."
        )
    coords = sample_uncertain_points(pred_logits.detach(), num_points, oversample_ratio,
                                     importance_sample_ratio, generator)  # [M, P, 2]
    return point_sample(pred_logits, coords), point_sample(gt_mask.float(), coords)


def mask_loss_per_mask(
    pred_logits: torch.Tensor,
    gt_mask: torch.Tensor,
    *,
    num_points: int = NUM_POINTS,
    oversample_ratio: float = 3.0,
    importance_sample_ratio: float = 0.75,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Upstream's mask loss of each mask ``[M]``: 2.0 · mean BCE over its points + 0.5 · its Dice term.

    The same points and weights as :func:`mask_losses`, kept per mask so that a caller can weight masks (the
    GRPO dense losses weight rollouts by their advantage); its mean over M equals ``loss_mask + loss_dice`` up
    to the 1e-4 avg factors.
    """
    point_logits, point_targets = _point_pairs("mask_loss_per_mask", pred_logits, gt_mask, num_points,
                                               oversample_ratio, importance_sample_ratio, generator)  # [M, P] each
    bce = F.binary_cross_entropy_with_logits(point_logits, point_targets, reduction="none").mean(-1)  # [M]
    return LOSS_MASK_WEIGHT * bce + LOSS_DICE_WEIGHT * dice_terms(point_logits, point_targets)  # [M]


def llm_loss(logits_fn, hidden: torch.Tensor, labels: torch.Tensor,
             token_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean token cross-entropy over supervised positions; hidden ``[B, L, D]``, labels ``[B, L]``.

    Position i predicts label i+1; ``logits_fn`` (the LM head) runs only where that label is
    supervised, so no ``[B, L, V]`` logits tensor is built. ``token_weights`` ``[B, L-1]`` (weight of
    the prediction made at position i) turns the mean into Σ w·CE / Σ w over supervised positions.
    """
    target = labels[:, 1:]  # [B, L-1]
    is_supervised = target != IGNORE_INDEX  # [B, L-1]
    if not bool(is_supervised.any()):
        raise ValueError("sft_loss: the batch has no supervised token (every label is -100).")
    logits = logits_fn(hidden[:, :-1][is_supervised]).float()  # [S, V]
    if token_weights is None:
        return F.cross_entropy(logits, target[is_supervised])
    weights = token_weights[is_supervised].float()  # [S]
    ce = F.cross_entropy(logits, target[is_supervised], reduction="none")  # [S]
    return (weights * ce).sum() / weights.sum().clamp_min(1e-8)


def iou_head_loss(low_res_logits: torch.Tensor, iou_scores: torch.Tensor, gt_mask: torch.Tensor) -> torch.Tensor:
    """SAM's IoU-prediction loss: mean_{m,k} (iou_scores[m, k] − IoU_{m,k})², targets without gradient.

    low_res_logits ``[M, K, h, w]`` (K multimask outputs), iou_scores ``[M, K]``, gt_mask ``[M, h, w]`` (0/1 at
    the logits size, ``resize_gt_masks``). IoU_{m,k} = |(logit > 0) ∧ gt| / |(logit > 0) ∨ gt|, and 1 when both
    are empty.
    """
    if low_res_logits.shape[0] != gt_mask.shape[0] or low_res_logits.shape[-2:] != gt_mask.shape[-2:]:
        raise ValueError(f"iou_head_loss: logits {tuple(low_res_logits.shape)} and GT {tuple(gt_mask.shape)} "
                         "must share M and (h, w); resize the GT with resize_gt_masks first.")
    pred = low_res_logits.detach() > 0  # [M, K, h, w]
    gt = gt_mask[:, None] > 0.5  # [M, 1, h, w]
    inter = (pred & gt).flatten(2).sum(-1).float()  # [M, K]
    union = (pred | gt).flatten(2).sum(-1).float()  # [M, K]
    target = torch.where(union > 0, inter / union.clamp_min(1), torch.ones_like(inter))  # [M, K]
    return F.mse_loss(iou_scores.float(), target)


def lm_forward(model, data: dict, image_embeds: list[torch.Tensor | None],
               seg_lm_weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(llm_loss, hidden [B, L, D])`` of one teacher-forced LLM pass: ``data`` holds ``input_ids``, ``labels``,
    ``attention_mask`` (and optionally ``position_ids``) on the model's device, ``image_embeds[b]`` the
    ``<IMG_CONTEXT>`` fill of row b (``Sa2VAModel.build_image_embeds``); ``hidden`` is the final-norm state, whose
    ``[SEG]`` rows feed ``text_hidden_fcs``. ``seg_lm_weight`` as in :func:`sft_forward`."""
    input_ids = data["input_ids"]  # [B, L]
    inputs_embeds = model.embed_inputs(input_ids, image_embeds)  # [B, L, D]
    body, head = decoder_and_head(model.language_model)
    hidden = body(inputs_embeds=inputs_embeds, attention_mask=data["attention_mask"].long(),
                  position_ids=data.get("position_ids"), use_cache=False).last_hidden_state  # [B, L, D]
    is_seg = input_ids == model.seg_token_id  # [B, L]
    weights = None if seg_lm_weight == 1.0 else torch.where(is_seg[:, :-1], seg_lm_weight, 1.0)  # [B, L-1]
    return llm_loss(head, hidden, data["labels"], weights), hidden


def _image_embeds(model, data: dict) -> list[torch.Tensor | None]:
    """Per-row ``<IMG_CONTEXT>`` fills: every tile's projected tokens, then the region tokens
    (``prompt_masks``) of a sample whose ``vp_overall_mask`` marks one of its tiles (docs/sa2va_internals.md §4.2)."""
    B = data["input_ids"].shape[0]
    pixel_values = data.get("pixel_values")
    if pixel_values is None:
        return [None] * B
    tiles = list(pixel_values)  # B × [n_b, 3, S, S] (a 5-D tensor or a list)
    n_tiles = [t.shape[0] for t in tiles]
    projected = model.project_vision(model.encode_vision(torch.cat(tiles).to(model.device)))  # [Σ n_b, t, D]
    vp_overall = data.get("vp_overall_mask")
    prompt_masks = iter(data.get("prompt_masks") or [])
    fills, start = [], 0
    for n in n_tiles:
        has_regions = vp_overall is not None and bool(vp_overall[start:start + n].any())
        region_cells = next(prompt_masks, None) if has_regions else None
        if has_regions and region_cells is None:
            raise ValueError("sft_loss: vp_overall_mask marks more samples than prompt_masks holds; "
                             "build the batch with Sa2VAProcessor.sft_collate.")
        fills.append(model.build_image_embeds(projected[start:start + n], region_cells))  # [k_b, D]
        start += n
    return fills


def _seg_targets(model, data: dict, seg_rows: list[int],
                 seg_counts: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``image_index [M]`` (row of the stacked ``g_pixel_values``) and the GT stacks of the rows that
    hold ``[SEG]`` (``seg_counts``: [SEG] tokens per batch row, counted on the host); upstream pairs the i-th
    such row with ``masks[i]`` and grounding frame i."""
    masks, frames = data["masks"], data.get("frames_per_batch") or []
    if any(f != 1 for f in frames):
        raise NotImplementedError(f"sft_loss: video samples (frames_per_batch={frames}) are not supported; "
                                  "only single-image SFT samples are.")
    if not len(seg_rows) == len(masks) == len(frames):
        raise ValueError(
            f"sft_loss: {len(seg_rows)} rows hold [SEG] but the batch has {len(masks)} mask stacks and "
            f"{len(frames)} grounding images; every segmentation sample needs all three (and only they).")
    image_index = []
    for i, (row, gt) in enumerate(zip(seg_rows, masks)):
        if seg_counts[row] != gt.shape[0]:
            raise ValueError(
                f"sft_loss: batch row {row} has {seg_counts[row]} [SEG] tokens but {gt.shape[0]} GT "
                "masks; check the answers (one [SEG] per target) and max_length truncation.")
        image_index += [i] * gt.shape[0]
    return torch.tensor(image_index, device=data["input_ids"].device), list(masks)


@dataclass
class SegForward:
    """The mask branch of one SFT batch, for auxiliary losses (M = ``[SEG]`` tokens, batch-row order).

    seg_hidden: ``[M, D]`` final-norm LLM states at the ``[SEG]`` inputs; prompt: ``[M, C_sam]`` after
    ``text_hidden_fcs``; decoder: the SAM2 ``MaskDecoderOutput`` (all multimask outputs); gt_mask: ``[M, h, w]``
    GT at the logits size; seg_rows: the batch row of each ``[SEG]``.
    """

    seg_hidden: torch.Tensor
    prompt: torch.Tensor
    decoder: object
    gt_mask: torch.Tensor
    seg_rows: torch.Tensor


def sft_loss(model, data: dict, **options) -> dict[str, torch.Tensor]:
    """Upstream SFT losses of one ``sft_collate`` batch: ``{'llm_loss', 'loss_mask', 'loss_dice'}`` (plus
    ``'loss_iou'`` when ``iou_loss_weight`` > 0). ``options``: those of :func:`sft_forward`."""
    return sft_forward(model, data, **options)[0]


def sft_forward(
    model,
    data: dict,
    *,
    num_points: int = NUM_POINTS,
    oversample_ratio: float = 3.0,
    importance_sample_ratio: float = 0.75,
    generator: torch.Generator | None = None,
    seg_lm_weight: float = 1.0,
    iou_loss_weight: float = 0.0,
) -> tuple[dict[str, torch.Tensor], SegForward | None]:
    """SFT losses of one ``sft_collate`` batch and what its mask branch computed (None without ``masks``).

    One teacher-forced LLM forward gives both the LM loss and the ``[SEG]`` hidden states (final
    norm, at the positions whose input is ``[SEG]``), which go through ``text_hidden_fcs`` and the
    SAM2 decoder (best of the multimask outputs by predicted IoU). The mask losses carry a
    ``0 · Σ params`` term over ``text_hidden_fcs`` and the mask decoder, so every tensor there gets
    a (possibly zero) gradient even without ``masks`` or for unused decoder heads (upstream uses a
    pseudo pass for the same reason: DeepSpeed/DDP expect a gradient for each trainable tensor).
    ``num_points`` is P per mask (12544 upstream for 256² logits).

    Args:
        model: a Sa2VAModel with a bound tokenizer.
        data: ``sft_collate(...)['data']`` (the full collate output is accepted too).
        seg_lm_weight: weight of the LM loss on the token predicted from a ``[SEG]`` input (module doc).
        iou_loss_weight: weight of SAM's IoU-prediction loss; 0 leaves it out (upstream).
    """
    if seg_lm_weight < 0 or iou_loss_weight < 0:
        raise ValueError(f"sft_loss: seg_lm_weight={seg_lm_weight} and iou_loss_weight={iou_loss_weight} must "
                         "be >= 0 (1 and 0 are upstream's loss).")
    data = data["data"] if "data" in data and "input_ids" not in data else data
    device = model.device
    # bookkeeping read by Python (which rows have regions / [SEG]) stays on the host: no device sync per row
    is_seg_host = data["input_ids"].cpu() == model.seg_token_id  # [B, L]
    data = {k: v.to(device) if torch.is_tensor(v) and k != "vp_overall_mask" else v for k, v in data.items()}
    if torch.is_tensor(data.get("vp_overall_mask")):
        data["vp_overall_mask"] = data["vp_overall_mask"].cpu()
    input_ids = data["input_ids"]  # [B, L]
    loss, hidden = lm_forward(model, data, _image_embeds(model, data), seg_lm_weight)
    is_seg = input_ids == model.seg_token_id  # [B, L]
    losses = {"llm_loss": loss}

    mask_path = [*model.text_hidden_fcs.parameters(),
                 *model.grounding_encoder.sam2_model.sam_mask_decoder.parameters()]
    zero = sum(p.sum() for p in mask_path) * 0.0
    mask_keys = ("loss_mask", "loss_dice") + (("loss_iou",) if iou_loss_weight > 0 else ())
    if data.get("masks") is None:
        return {**losses, **{key: zero for key in mask_keys}}, None
    seg_rows = [int(r) for r in torch.nonzero(is_seg_host.any(-1)).flatten()]
    image_index, gt_masks = _seg_targets(model, data, seg_rows, is_seg_host.sum(-1).tolist())
    features = model.encode_grounding(torch.stack(list(data["g_pixel_values"])).to(model.device))
    seg_hidden = hidden[is_seg]  # [M, D], row-major like image_index
    prompt = model.seg_hidden_to_prompt(seg_hidden)  # [M, C_sam]
    decoded = model.decode_masks(prompt, features, image_index)
    pred_logits = decoded.best_logits  # [M, h, w]
    gt = resize_gt_masks([m.to(pred_logits.device) for m in gt_masks], tuple(pred_logits.shape[-2:]))  # [M, h, w]
    # (a GT stack already at the logits size is resized to itself: nearest at scale 1 is the identity)
    loss_mask, loss_dice = mask_losses(pred_logits, gt, num_points=num_points, oversample_ratio=oversample_ratio,
                                       importance_sample_ratio=importance_sample_ratio, generator=generator)
    losses.update(loss_mask=loss_mask + zero, loss_dice=loss_dice + zero)
    if iou_loss_weight > 0:
        losses["loss_iou"] = iou_loss_weight * iou_head_loss(decoded.low_res_logits, decoded.iou_scores, gt) + zero
    rows = torch.nonzero(is_seg_host)[:, 0]  # [M]
    return losses, SegForward(seg_hidden, prompt, decoded, gt, rows)
