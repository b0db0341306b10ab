"""The three stages of the tiny pretraining recipe as one-step functions, plus the stage loop (``pretrain_tiny.py``).

* ``sam`` — promptable segmentation of the tiny SAM2 (image encoder, prompt encoder, mask decoder), as SAM2 was
  pretrained (Kirillov et al. 2023, §3; Ravi et al. 2024): clicks and boxes, multimask output, per output
  ``BCE + dice`` (SAM: focal + dice, see :func:`sam_loss`), the best output trained (min over K), plus the
  IoU-prediction MSE on all K. Optional
  attribute prompts: ``AttributePrompt`` (a learned sum of colour/shape/size/cell embeddings) sits in the ``[SEG]``
  slot of ``GroundingEncoder.decode``, so the decoder learns to pick an object by what a text states.
* ``lm`` — next-token language pretraining of the tiny LLM on shapes-world phrases.
* ``video`` — video RES on ``ShapesVideoWorld`` clips (:func:`video_step`): the row's ``[SEG]`` state →
  ``text_hidden_fcs`` → SAM2 memory propagation over all T frames (prompted on the n MLLM frames, from memory after)
  → the SFT mask loss on every frame against the GT masklet, plus the answer's LM loss; it trains SAM2's memory
  modules (memory attention, memory encoder, object-pointer projection, temporal encodings), which the image
  stages never reach. Interleaved ``joint`` image batches (``image_share``) keep the image skills.
* ``joint`` — Sa2VA SFT of every weight (``model.sft.sft_loss.sft_forward``: token CE + mask BCE + Dice, SAM's
  IoU-head loss, ``seg_lm_weight``) with the encoders trained too, plus an optional *teacher* term: the ``[SEG]``
  prompt is pulled towards the frozen ``AttributePrompt`` of the row's text, ``w_t · MSE(prompt, A(text))`` with
  ``w_t`` decaying linearly to 0 over the stage, so the LLM first learns to say in the ``[SEG]`` state what the
  decoder already reads, and the end of the stage is the plain SFT loss.

Pretrained encoders are frozen in Sa2VA (``encode_vision`` / ``GroundingEncoder.encode`` run under ``no_grad``);
random tiny ones are too weak (docs/demo.md), so :func:`trainable_encoders` swaps in the undecorated functions on
this model instance for the duration of the stage. The saved checkpoint is ordinary: inference and RL keep the
encoders frozen.
"""
from __future__ import annotations

import contextlib
import json
import math
import time
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..model.decoding.generation import decoder_and_head
from ..model.decoding.text_decoding import eval_mode
from ..model.sft.sft_loss import iou_head_loss, llm_loss, lm_forward, mask_losses, sft_forward
from .pretrain_data import ATTRIBUTES, JointBatch, PromptBatch, TextBatch, VideoBatch



class AttributePrompt(nn.Module):
    """``A(a) = b + Σ_attr E_attr[a_attr]`` → ``[M, C]`` for attribute ids ``a`` ``[M, 4]`` (last id = unstated)."""

    def __init__(self, dim: int):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(len(values) + 1, dim) for values in ATTRIBUTES.values())
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.bias + sum(table(ids[:, a]) for a, table in enumerate(self.tables))  # [M, C]


@contextlib.contextmanager
def trainable_encoders(model):
    """Within the block, ``model.encode_vision`` and its grounding ``encode`` keep gradients (instance-level
    override of the ``no_grad`` methods; the classes and other instances are untouched)."""
    grounding = model.grounding_encoder
    model.encode_vision = types.MethodType(type(model).encode_vision.__wrapped__, model)
    grounding.encode = types.MethodType(type(grounding).encode.__wrapped__, grounding)
    try:
        yield
    finally:
        del model.encode_vision, grounding.encode


def lr_factor(step: int, steps: int, warmup: int) -> float:
    """Linear warm-up to 1 over ``warmup`` steps, then cosine decay to 0.1 at ``steps``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def sam_loss(low_res_logits: torch.Tensor, iou_scores: torch.Tensor, gt_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Loss on K multimask outputs: per output ``BCE + dice`` (BCE a mean over the h×w pixels), the lowest of
    the K trained (``min_k``, mean over M), and the IoU-head MSE on all K.

    Differs from SAM (focal : dice = 20 : 1): from random init, BCE + Dice learned faster — on CPU, 4 scenes a
    step, the Dice term of the best output fell to 0.42 after 60 steps against 0.68 with SAM's focal loss.
    low_res_logits ``[M, K, h, w]``, iou_scores ``[M, K]``, gt_mask ``[M, h, w]`` (0/1 at the logits size).
    """
    gt = gt_mask[:, None].expand_as(low_res_logits).float()  # [M, K, h, w]
    p = low_res_logits.sigmoid()
    bce = F.binary_cross_entropy_with_logits(low_res_logits, gt, reduction="none").flatten(2).mean(-1)  # [M, K]
    dice = 1 - (2 * (p * gt).flatten(2).sum(-1) + 1) / (p.flatten(2).sum(-1) + gt.flatten(2).sum(-1) + 1)  # [M, K]
    return {"loss_mask": (bce + dice).min(dim=1).values.mean(),
            "loss_iou": iou_head_loss(low_res_logits, iou_scores, gt_mask)}


def decode_clicks(model, features, image_index: torch.Tensor, coords: torch.Tensor, labels: torch.Tensor):
    """SAM2 decoder on click/box prompts (coords ``[M, 2, 2]``, labels ``[M, 2]``) → (logits ``[M, 3, h, w]``,
    iou ``[M, 3]``), the same features and skips as ``GroundingEncoder.decode``."""
    sam = model.grounding_encoder.sam2_model
    sparse, dense = sam.sam_prompt_encoder(points=(coords, labels), boxes=None, masks=None)  # [M, 3, C], [M, C, e, e]
    decoder = sam.sam_mask_decoder
    s0 = decoder.conv_s0(features.high_res_feats[0])[image_index]  # [M, C/8, 4e, 4e]
    s1 = decoder.conv_s1(features.high_res_feats[1])[image_index]  # [M, C/4, 2e, 2e]
    logits, iou, _, _ = decoder(image_embeddings=features.image_embed[image_index],
                                image_pe=sam.sam_prompt_encoder.get_dense_pe(), sparse_prompt_embeddings=sparse,
                                dense_prompt_embeddings=dense, multimask_output=True, repeat_image=False,
                                high_res_features=[s0, s1])
    return logits.float(), iou


def sam_step(model, attribute_prompt: AttributePrompt, batch: PromptBatch) -> dict[str, torch.Tensor]:
    """Losses of one promptable-segmentation batch (clicks/boxes and attribute prompts decoded apart), averaged
    over all M prompts."""
    device = model.device
    features = model.encode_grounding(batch.g_pixel_values.to(device).float())
    image_index, gt = batch.image_index.to(device), batch.gt_mask.to(device)  # [M], [M, h, w]
    is_attr = batch.is_attribute  # [M], on the host: Python control flow without a device sync
    parts = []
    if bool((~is_attr).any()):
        clicks = (~is_attr).to(device)
        coords, labels = batch.point_coords.to(device)[clicks], batch.point_labels.to(device)[clicks]
        parts.append((~is_attr, *decode_clicks(model, features, image_index[clicks], coords, labels), gt[clicks]))
    if bool(is_attr.any()):
        chosen = is_attr.to(device)
        out = model.decode_masks(attribute_prompt(batch.attributes.to(device)[chosen]), features, image_index[chosen])
        parts.append((is_attr, out.low_res_logits, out.iou_scores, gt[chosen]))
    losses = {}
    for which, logits, iou, part_gt in parts:
        share = float(which.float().mean())
        for name, value in sam_loss(logits, iou, part_gt).items():
            losses[name] = losses.get(name, 0.0) + value * share
    losses["loss"] = losses["loss_mask"] + losses["loss_iou"]
    return losses


def lm_step(model, batch: TextBatch) -> dict[str, torch.Tensor]:
    """Next-token cross-entropy of the LLM alone on phrase rows."""
    device = model.device
    body, head = decoder_and_head(model.language_model)
    hidden = body(input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device).long(),
                  use_cache=False).last_hidden_state  # [B, L, D]
    loss = llm_loss(head, hidden, batch.labels.to(device))
    return {"llm_loss": loss, "loss": loss}


@dataclass
class JointWeights:
    """Loss weights of the joint stage (see ``PretrainSettings``)."""

    mask: float = 1.0
    iou: float = 1.0
    seg_lm: float = 1.0
    teacher: float = 0.0
    num_points: int = 1024


def joint_step(model, attribute_prompt: AttributePrompt | None, batch: JointBatch, weights: JointWeights,
               teacher_scale: float, generator: torch.Generator | None) -> dict[str, torch.Tensor]:
    """``llm + w_mask (mask + dice) + iou (+ w_teacher · scale · MSE(prompt, A(text)))`` of one SFT batch."""
    data = batch.sft_data(model.device)
    losses, seg = sft_forward(model, data, num_points=weights.num_points, generator=generator,
                              seg_lm_weight=weights.seg_lm, iou_loss_weight=weights.iou)
    mask = losses["loss_mask"] + losses["loss_dice"]
    total = losses["llm_loss"] + weights.mask * mask + losses.get("loss_iou", 0.0)
    if weights.teacher > 0 and attribute_prompt is not None and seg is not None:
        with torch.no_grad():
            target = attribute_prompt(batch.seg_attributes.to(model.device))  # [M, C]
        losses["loss_teacher"] = F.mse_loss(seg.prompt.float(), target)
        total = total + weights.teacher * teacher_scale * losses["loss_teacher"]
    losses["loss"] = total
    return losses


def video_step(model, batch: VideoBatch, weights: JointWeights, generator: torch.Generator | None
               ) -> dict[str, torch.Tensor]:
    """``llm + w_mask (mask + dice)`` of one video RES batch, the mask terms over every frame of every masklet.

    Each clip's MLLM frames are encoded once and shared by its rows; all clips' SAM2 frames go through the encoder
    in one call and are tracked in one propagation (``propagate_masklets`` with a clip index per prompt). SAM2 runs
    in eval mode there, the mode inference propagates in (its memory bank is read differently in training mode).
    Also returns two detached diagnostics: the mean IoU (logits > 0 against the GT, 1 when both are empty) of the
    prompted frames (``iou_prompted``) and of the propagated ones (``iou_tracked``).
    """
    device = model.device
    C, n = batch.pixel_values.shape[:2]
    T = batch.g_pixel_values.shape[1]
    data = {k: v.to(device) for k, v in batch.text.items()}
    row_clip = batch.row_clip.to(device)  # [B]
    projected = model.project_vision(model.encode_vision(batch.pixel_values.to(device).flatten(0, 1)))  # [C·n, t, D]
    per_clip = [model.build_image_embeds(projected[c * n:(c + 1) * n]) for c in range(C)]  # C × [n·t, D]
    llm, hidden = lm_forward(model, data, [per_clip[c] for c in batch.row_clip.tolist()], weights.seg_lm)
    is_seg = data["input_ids"] == model.seg_token_id  # [B, L]
    seg_rows = torch.nonzero(is_seg)[:, 0]  # [M] row of each [SEG], row-major
    features = model.encode_grounding(batch.g_pixel_values.to(device).flatten(0, 1).float(),
                                      keep_memory_inputs=True)  # C·T frames, clip-major
    prompt = model.seg_hidden_to_prompt(hidden[is_seg])  # [M, C_sam]
    with eval_mode(model.grounding_encoder.sam2_model):
        logits = model.propagate_masklets(prompt, features, n, clip_index=row_clip[seg_rows], num_clips=C)
    gt = batch.masklets.to(device)[seg_rows]  # [M, T, h, w]
    loss_mask, loss_dice = mask_losses(logits.flatten(0, 1), gt.flatten(0, 1), num_points=weights.num_points,
                                       generator=generator)  # every frame of every masklet is one mask
    with torch.no_grad():
        hit = logits > 0
        union = (hit | (gt > 0.5)).flatten(2).sum(-1)  # [M, T]
        iou = torch.where(union > 0, (hit & (gt > 0.5)).flatten(2).sum(-1) / union.clamp_min(1), 1.0)
        tracked = iou[:, n:] if T > n else iou.new_zeros(1, 0)
    return {"llm_loss": llm, "loss_mask": loss_mask, "loss_dice": loss_dice,
            "iou_prompted": iou[:, :n].mean(), "iou_tracked": tracked.mean() if tracked.numel() else iou.new_tensor(0.),
            "loss": llm + weights.mask * (loss_mask + loss_dice)}


@dataclass
class StageLog:
    """What a stage did: steps asked, steps planned after fitting to the time budget, steps done, seconds
    (wall, data wait), stopped early (hard stop at the budget), logged rows."""

    name: str
    steps: int
    planned_steps: int = 0
    steps_done: int = 0
    seconds: float = 0.0
    data_wait_s: float = 0.0
    stopped_early: bool = False
    rows: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("name", "steps", "planned_steps", "steps_done", "seconds",
                                              "data_wait_s", "stopped_early", "rows")}


FIT_WINDOW = (10, 30)  # steps between which a time-budgeted stage measures its speed


def _row(name: str, step: int, losses: dict, grad_norm, lr: float, elapsed: float, wait: float) -> dict:
    values = {k: round(float(v.detach() if torch.is_tensor(v) else v), 4) for k, v in losses.items()}
    return {"stage": name, "step": step, **values, "grad_norm": round(float(grad_norm), 3), "lr": lr,
            "elapsed_s": round(elapsed, 1), "data_wait_s": round(wait, 1)}


def run_stage(name: str, batches: Iterable, step_fn: Callable[[object, int], dict], params: list[nn.Parameter], *,
              steps: int, lr: float, warmup: int, time_budget_s: float, log_every: int,
              on_log: Callable[[int], dict] | None = None, eval_every: int = 0) -> StageLog:
    """AdamW (no weight decay, ``lr_factor`` schedule, clip 1.0) over ``steps`` batches; ``step_fn(batch,
    progress)`` (progress = (step − 1) / planned steps, in [0, 1)) returns the losses, the total under ``'loss'``.

    With ``time_budget_s`` > 0 the stage times steps 10-30 and, if ``steps`` would not fit in 90 % of the
    budget, plans fewer (the schedule then decays over the planned steps); past the budget it stops at once.
    """
    log = StageLog(name, steps, planned_steps=steps)
    if steps <= 0:
        return log
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, log.planned_steps, warmup))
    start = fetched = time.perf_counter()
    window_start = start
    for step, batch in enumerate(batches, start=1):
        log.data_wait_s += time.perf_counter() - fetched
        losses = step_fn(batch, (step - 1) / log.planned_steps)
        optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        log.steps_done = step
        elapsed = time.perf_counter() - start
        if time_budget_s > 0 and step == FIT_WINDOW[0]:
            window_start = time.perf_counter()
        if time_budget_s > 0 and step == FIT_WINDOW[1] < log.planned_steps:
            per_step = (time.perf_counter() - window_start) / (FIT_WINDOW[1] - FIT_WINDOW[0])
            log.planned_steps = max(step + 1, min(log.planned_steps, int(0.9 * time_budget_s / per_step)))
        is_last = step >= log.planned_steps or (time_budget_s > 0 and elapsed > time_budget_s)
        if step % log_every == 0 or is_last or (eval_every and step % eval_every == 0):
            row = _row(name, step, losses, grad_norm, optimizer.param_groups[0]["lr"], elapsed, log.data_wait_s)
            if on_log is not None and eval_every and (step % eval_every == 0 or is_last):
                row.update(on_log(step))
            log.rows.append(row)
            print(json.dumps(row), flush=True)
        if is_last:
            log.stopped_early = step < log.planned_steps
            break
        fetched = time.perf_counter()
    log.seconds = round(time.perf_counter() - start, 1)
    log.data_wait_s = round(log.data_wait_s, 1)
    return log
