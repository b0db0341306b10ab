"""The two cycle loops (docs/architecture.md): each draws an action with the policy, scores it under the reference, lets
the EMA partner close the cycle, and hands back a ``Rollout`` plus the inputs of its rewards.

* Loop 1, mask → caption → mask' (``MaskToCaptionLoop``, named ``mask_to_caption``): the policy captions the gt
  region G times (region prompt, sampled tokens); the partner segments each caption (greedy RES answer, ``[SEG]`` →
  SAM2); reward IoU(gt_mask, mask'). Action = caption tokens.
* Loop 2, caption → mask → caption' (``CaptionToMaskLoop``, named ``caption_to_mask``): the policy grounds the gt
  caption; its ``[SEG]`` state parametrises the configured stochastic mask policy, which samples G masks; the partner
  describes each mask (region prompt, greedy caption); reward from the caption rewards (METEOR + judge). Action = the
  mask (by default the partner's g x g region cells themselves, ``mask_policy='region'``), scored with one clipped
  ratio per mask (``mask_importance_sampling_level='sequence'``).

A loop's ``name`` is its one name everywhere: the config knobs (``<name>_weight``, the ``rewards`` key), its
rollouts' ``Rollout.loop`` and its metrics (``<name>/reward_mean``).

Loop 2's answer text is teacher-forced, not sampled: it is a fixed in-distribution SFT answer (``Sure, [SEG].``,
one of Sa2VA's five RES answers). Sampling it would add a second, text action whose tokens only shift the ``[SEG]``
state, could omit ``[SEG]`` altogether (no mask, no reward), and would make the G masks of a group differ by their
preambles rather than by the mask policy. With a fixed answer the ``[SEG]`` state is one deterministic function of
(image, caption) per prompt, computed on B rows and shared by the group's G samples, and the mask policy is the
only source of randomness.

On a video step (``StepFeatures.video`` set; grpo/features.py) the same two classes run on clips. Loop 1's policy pass
is the image one on the sample's key frame (the frame where its gt masklet is largest, shown as a one-tile image);
the partner grounds each caption in the whole clip (video RES prompt over the MLLM frames, SAM2 propagation) and
the reward compares masklets (``video_jf``): a caption written from one frame must identify the object across the
clip. Loop 2's policy grounds the text with the video RES prompt; its action is the mask sampled on ONE frame, the
MLLM frame where the policy's deterministic mask is largest (chosen at rollout time without grad, kept in
``MaskReplay.grounding_index``), and the partner describes that mask on that frame. The action is that one frame's
mask, not a masklet, because the partner only ever sees that frame: log-probability spent on the other frames'
masks would be credited with a reward it cannot affect. The policy's propagated masklet is scored against the gt
masklet as a statistic (``video/policy_jf``). No loss pass propagates, so a video step's loss costs what an image
step's does with n-tile prompts.

On the Qwen-VL family (``is_qwen_vl_model``) loop 1's region input is the gt region drawn into a copy of the
sample's image (``StepFeatures.drawn_regions``, drawn once per step) with the outline-naming caption question, the
partner's own describe-a-mask input; its captions are sampled by ``GRPOConfig.decode_backend`` on the family seam
(``qwen_vl_prompts.qwen_vl_sample_text``: M-RoPE positions, Qwen3-VL's deepstack; each prompt prefilled once on the
fast decoders) and scored by the same grouped pass with those positions and additions. Video steps are refused there
at ``encode``.

Each loop's ``action_logp`` is the single function that scores a given action (CleanRL's
``get_action_and_value``): the rollout calls it (no grad) for ``old_logp`` and, inside ``WeightSets.reference``,
for ``ref_logp``; the loss calls it with grad (through the loop's own ``loss_fn``). With compiled decoder layers the
trainer scores ``old_logp`` itself, with the loss's mode and grad on (grpo/trainer.py), and the loops skip theirs. The
sampling pass builds the same prompt embeddings / mask head.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import torch
from torch import Tensor

from ..model.decoding.grouped_scoring import (
    Branch, branched_hidden, completion_branch, completion_logprobs_from_states, grouped_completion_logprobs)
from ..model.decoding.text_decoding import (
    TextDecoding, completion_texts, eval_mode, fed_back_seg_positions, group_chunks, host_completions, sample_text)
from ..model.pipeline.shared import (
    EncodedImages, forced_answer_masks, forced_answer_seg_prompts, host_to_device, is_qwen_vl_model, prompt_embeds,
    to_host)
from ..model.pipeline.qwen_vl_prompts import qwen_vl_prompt_inputs, qwen_vl_sample_text
from ..model.pipeline.region_chain import MaskChain
from ..model.pipeline.video import largest_mask_frames, masklet_masks, video_masklet_logits
from ..model.sft.sft_loss import mask_loss_per_mask, resize_gt_masks
from ..model.text.lengths import bucket_length
from ..rewards.base import RewardInputs
from ..rewards.video_metrics import score_masklets
from .dense import best_in_group, dense_rollout_weights, weighted_mean
from .features import StepFeatures
from .losses import PolicyLoss
from .mask_policy import MaskHead
from .passes import cat_chunks, partner_describe, partner_segment, partner_segment_video, slice_rows
from .rollout import AnswerReplay, CaptionReplay, MaskReplay, Rollout


@dataclass
class CycleContext:
    """What both loops share (built once by ``CycleGRPO``).

    Attributes:
        model, processor, weights, config: the unwrapped ``Sa2VAModel``, its processor, the ``WeightSets`` and the
            validated ``GRPOConfig``.
        mask_policy: the loop-2 ``MaskPolicy``.
        decoding: stop tokens / words of the template.
        seg_answer_ids: ``[A]`` long, the teacher-forced loop-2 answer; seg_answer_index: position of its ``[SEG]``.
        seg_answer_max_tokens: greedy budget of the partner's RES answer in loop 1.
        use_partner_captions: loop 2 runs the partner's description pass (False only for mask-only rewards).
        generator: RNG of every sampling draw (None: torch's global RNG).
    """

    model: object
    processor: object
    weights: object
    config: object
    mask_policy: object
    decoding: TextDecoding
    seg_answer_ids: Tensor
    seg_answer_index: int
    seg_answer_max_tokens: int
    use_partner_captions: bool
    generator: torch.Generator | None


@dataclass
class LoopRollout:
    """One loop's output of a step: the rollout, its reward inputs (N rows) and partner/action statistics."""

    rollout: Rollout
    reward_inputs: RewardInputs
    stats: dict[str, float]


def _partner_captions(ctx, features: StepFeatures, encoded: EncodedImages, images: Sequence[int], pred_masks, G: int,
                      chunk: int) -> tuple[list[str] | None, dict]:
    """Loop 2's reward input: the EMA partner's caption of each policy mask, mask n shown on image ``images[n]`` of
    ``encoded`` (``(None, {})`` when ``use_partner_captions`` is off)."""
    if not ctx.use_partner_captions:
        return None, {}
    model = ctx.model
    with ctx.weights.partner(model):
        return partner_describe(model, ctx.processor, encoded, model.project_vision(encoded.vit_tokens), pred_masks,
                                images, _repeat(features.sample_ids, G), ctx.decoding,
                                max_new_tokens=ctx.config.max_completion_length, chunk_size=chunk)


def _repeat(items: Sequence, G: int) -> list:
    """``[x_0]*G + [x_1]*G + ...``: per-sample values laid out per rollout (n = b * G + g)."""
    return [x for x in items for _ in range(G)]


def reward_inputs(features: StepFeatures, G: int, pred_masks=None, pred_captions=None) -> RewardInputs:
    """N-row reward inputs: the step's targets repeated per rollout plus a loop's predictions."""
    return RewardInputs(sample_ids=_repeat(features.sample_ids, G), pred_masks=pred_masks,
                        gt_masks=_repeat(features.gt_masks, G), pred_captions=pred_captions,
                        gt_captions=_repeat(features.references, G),
                        images=_repeat(features.reward_images(), G))


def mask_iou(pred_logits: Tensor, target: Tensor) -> Tensor:
    """Mean IoU of ``pred_logits > 0`` against bool targets ``[M, h, w]`` (an empty union counts 1), detached."""
    pred, target = pred_logits.detach() > 0, target.bool()
    inter = (pred & target).flatten(1).sum(-1).float()
    union = (pred | target).flatten(1).sum(-1).float()
    return torch.where(union > 0, inter / union.clamp(min=1), torch.ones_like(inter)).mean()


def teacher_forced_seg_logits(model, features: StepFeatures, tile_embeds: Tensor, prompt_ids: Tensor,
                              prompt_attention: Tensor, images: Sequence[int], answer_ids: Tensor,
                              seg_index: int) -> Tensor:
    """The policy's mask logits ``[m, h, w]`` for m RES prompts (left padded ``[m, L]``) answered with the fixed
    ``answer_ids [A]`` (its ``[SEG]`` at ``seg_index``): the pipeline's ``forced_answer_masks`` on the step's cached
    features (best of multimask); carries grad through LoRA, ``mlp1``, ``text_hidden_fcs`` and the decoder."""
    keep = prompt_attention.any(0)  # columns that are padding in every selected row are dropped (left padding)
    return forced_answer_masks(model, features, tile_embeds, prompt_ids[:, keep], prompt_attention[:, keep], images,
                               answer_ids, seg_index).best_logits  # [m, h, w]


# ---- loop 1: the caption action ------------------------------------------------------------------------------


def caption_logp(model, features: StepFeatures, tile_embeds: Tensor, replay: CaptionReplay, completion_mask: Tensor,
                 samples: Sequence[int], group_size: int, temperature: float, logprob_head: str) -> Tensor:
    """log pi(c_t | region prompt, c_<t) of stored caption tokens under the weights in effect: ``[n, T]``.

    The n = b * G rows hold b prompts repeated G times; the prompt embeddings are built for the b distinct prompts
    (image tokens + region tokens from ``tile_embeds``), and each prompt runs once for its G captions
    (``grouped_completion_logprobs``: b·L + n·T tokens, not n·(L + T), gradient through the shared prompt) at the
    sampling temperature, the head scoring as ``logprob_head`` says (``GRPOConfig.logprob_head``). ``old_logp``,
    ``ref_logp`` and the loss all score through here, so the first ratio is 1.
    """
    G = group_size
    if features.drawn_regions is not None:  # Qwen-VL: the region drawn into the image (module docstring)
        inputs = qwen_vl_prompt_inputs(model, features.drawn_regions, list(samples), replay.prompt_ids[::G],
                                       replay.prompt_attention[::G])  # [b, L, D], positions [3, b, L]
        return grouped_completion_logprobs(model.hf_model, inputs.embeds, replay.prompt_attention[::G],
                                           replay.completion_ids, completion_mask, num_generations=G,
                                           temperature=temperature, logprob_head=logprob_head,
                                           prompt_positions=inputs.positions,
                                           prefix_additions=inputs.layer_additions)  # [n, T]
    embeds = region_prompt_embeds(model, features, tile_embeds, replay, samples, G)  # [b, L, D]
    return grouped_completion_logprobs(model.language_model, embeds, replay.prompt_attention[::G],
                                       replay.completion_ids, completion_mask, num_generations=G,
                                       temperature=temperature, logprob_head=logprob_head)  # [n, T]


def region_prompt_embeds(model, features: StepFeatures, tile_embeds: Tensor, replay: CaptionReplay,
                         samples: Sequence[int], group_size: int) -> Tensor:
    """The b distinct region prompts of a (sliced) loop-1 replay as embeddings ``[b, L, D]``: image tokens from
    ``tile_embeds``, region tokens from the samples' gt cells."""
    return prompt_embeds(model, features, tile_embeds, replay.prompt_ids[::group_size],
                         [features.image_of(s) for s in samples], list(features.region_cells[list(samples)]))


class MaskToCaptionLoop:
    """Loop 1 (mask → caption → mask'), reward IoU(gt_mask, partner mask') by default."""

    name = "mask_to_caption"  # the loop's one name: config knobs (<name>_weight, rewards key), metrics (<name>/...)

    def __init__(self, ctx: CycleContext, composer, weight: float):
        self.ctx, self.composer, self.weight = ctx, composer, weight
        self.loss_fn = PolicyLoss.from_config(ctx.config)  # importance_sampling_level, TRL's meaning
        self.dense_weight = float(ctx.config.mask_to_caption_dense_weight)

    def action_logp(self, model, features: StepFeatures, tile_embeds: Tensor, rollout: Rollout,
                    samples: Sequence[int]) -> Tensor:
        """Caption-token log-probs ``[n, T]`` of a (sliced) loop-1 rollout; carries grad outside ``no_grad``."""
        return caption_logp(model, features, tile_embeds, rollout.replay, rollout.action_mask, samples,
                            rollout.group_size, self.ctx.config.temperature, self.ctx.config.logprob_head)

    def loss_terms(self, model, features: StepFeatures, tile_embeds: Tensor, rollout: Rollout,
                   samples: Sequence[int], num_active_tokens: float | None,
                   logp: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """The loop's loss with grad: the clipped policy gradient on the caption tokens, plus
        ``mask_to_caption_dense_weight`` times :meth:`dense_loss` when that weight is > 0. ``logp``: the action's
        log-probs with grad when the caller scored them already (:func:`joint_action_logps`)."""
        if logp is None:
            logp = self.action_logp(model, features, tile_embeds, rollout, samples)  # [n, T]
        loss, stats = self.loss_fn(logp, rollout, num_active_tokens=num_active_tokens)
        if self.dense_weight > 0:
            dense, dense_stats = self.dense_loss(model, features, tile_embeds, rollout, samples)
            loss = loss + self.dense_weight * dense
            stats.update(dense_stats)
        return loss, stats

    def dense_loss(self, model, features: StepFeatures, tile_embeds: Tensor, rollout: Rollout,
                   samples: Sequence[int]) -> tuple[Tensor, dict[str, Tensor]]:
        """Dice + BCE of the policy's segmentation of its own sampled captions against the input region, weighted
        per rollout by ``mask_to_caption_dense_rollouts`` (grpo/dense.py); only rollouts with weight > 0 and a
        non-empty caption run the segmentation pass.

        Stats: ``dense_term`` (the unweighted loss), ``dense_frac`` (share of rollouts that got it), ``dense_iou``
        (IoU of the policy's mask with the region on those rollouts, low-res)."""
        cfg, replay, G = self.ctx.config, rollout.replay, rollout.group_size
        if replay.seg_prompt_ids is None:
            raise ValueError("MaskToCaptionLoop.dense_loss: the rollout holds no RES prompts of its captions; it was "
                             "sampled with mask_to_caption_dense_weight=0.")
        weights = dense_rollout_weights(rollout.advantages, G, cfg.mask_to_caption_dense_rollouts)  # [n]
        weights = weights * replay.has_caption.to(weights)
        rows = torch.nonzero(weights > 0).flatten().tolist()
        # a 0 that carries grad to mlp1 when no rollout qualifies (the Qwen-VL family has no per-pass projection)
        zero = tile_embeds.sum() * 0.0 if tile_embeds is not None else torch.zeros((), device=model.device)
        if not rows:
            return zero, {"dense_term": zero.detach(), "dense_frac": zero.detach(), "dense_iou": zero.detach()}
        owners = [samples[n // G] for n in rows]
        logits = teacher_forced_seg_logits(
            model, features, tile_embeds, replay.seg_prompt_ids[rows], replay.seg_prompt_attention[rows],
            [features.image_of(b) for b in owners], host_to_device([self.ctx.seg_answer_ids], model.device),
            self.ctx.seg_answer_index)  # [m, h, w]
        target = resize_gt_masks([features.gt_masks[b][None].to(logits.device) for b in owners],
                                 tuple(logits.shape[-2:]))  # [m, h, w]
        per_mask = mask_loss_per_mask(logits, target, num_points=cfg.dense_num_points,
                                      generator=self.ctx.generator)  # [m]
        dense = weighted_mean(per_mask, weights[rows].to(per_mask))
        with torch.no_grad():
            stats = {"dense_term": dense.detach(), "dense_frac": torch.tensor(len(rows) / len(weights)),
                     "dense_iou": mask_iou(logits, target > 0.5)}
        return dense, stats

    @torch.no_grad()
    def rollout(self, features: StepFeatures, *, needs_old_logp: bool, needs_ref_logp: bool = True) -> LoopRollout:
        """G sampled captions per gt region (policy), their ``old_logp`` (if needed) and ``ref_logp`` (if beta > 0 and
        ``needs_ref_logp``: the trainer may score it itself), and the partner's mask' for each; rewards are left NaN
        for ``CycleGRPO.score``."""
        ctx, model, proc, cfg = self.ctx, self.ctx.model, self.ctx.processor, self.ctx.config
        B, G, chunk = features.num_samples, cfg.num_generations, cfg.generation_chunk_size
        if features.video is not None and self.dense_weight > 0:
            raise ValueError(f"{self.name} loop: mask_to_caption_dense_weight={self.dense_weight} is not supported on "
                             f"video steps (e.g. sample {features.sample_ids[0]!r}); set it to 0 for video data.")
        images = [features.image_of(b) for b in range(B)]
        ids, attention = self.region_prompts(features)  # [B, L]
        with eval_mode(model):
            tiles = model.project_vision(features.vit_tokens)  # [n_tiles, t, D]
            sampling = dict(num_generations=G, max_new_tokens=cfg.max_completion_length, do_sample=True,
                            temperature=cfg.temperature, top_p=cfg.top_p, chunk_size=chunk, generator=ctx.generator)
            if features.drawn_regions is None:
                embeds = prompt_embeds(model, features, tiles, ids, images, list(features.region_cells))  # [B, L, D]
                # B prompts, G samples each (prefilled once per prompt on the fast path)
                completions = sample_text(model, embeds, attention, ctx.decoding, **sampling)  # ids [N, T]
            else:  # Qwen-VL: each sample's drawn image, through the family seam (module docstring)
                completions = qwen_vl_sample_text(model, features.drawn_regions, range(B), ids, attention,
                                                  ctx.decoding, **sampling)  # ids [N, T]
            replay = CaptionReplay(prompt_ids=ids.repeat_interleave(G, 0),
                                   prompt_attention=attention.repeat_interleave(G, 0), completion_ids=completions.ids,
                                   image_index=features.image_index.repeat_interleave(G))

            def score(tile_embeds: Tensor) -> Callable[[int, int], Tensor]:
                return lambda b0, b1: caption_logp(
                    model, features, tile_embeds, slice_rows(replay, b0 * G, b1 * G),
                    completions.completion_mask[b0 * G:b1 * G], range(b0, b1), G, cfg.temperature, cfg.logprob_head)

            # old_logp must equal the loss pass's values bit for bit (ratio 1): the loss scores through caption_logp too
            old_logp = cat_chunks(score(tiles), B, G, chunk) if needs_old_logp else None
            ref_logp = None
            if cfg.beta > 0 and needs_ref_logp:
                with ctx.weights.reference(model):
                    ref_logp = cat_chunks(score(model.project_vision(features.vit_tokens)), B, G, chunk)
            captions = completion_texts(host_completions(completions), ctx.decoding)
            if self.dense_weight > 0:  # the RES prompts of the policy's own captions, for dense_loss
                replay = self._with_seg_prompts(replay, features, captions, images)
            with ctx.weights.partner(model):
                partner_tiles = model.project_vision(features.vit_tokens)
                if features.video is None:
                    pred_masks, stats = partner_segment(
                        model, proc, features, partner_tiles, captions, _repeat(images, G), ctx.decoding,
                        max_new_tokens=ctx.seg_answer_max_tokens, chunk_size=chunk)
                else:  # the caption of one frame is grounded in the whole clip: masklets [T, H, W]
                    pred_masks, stats = partner_segment_video(
                        model, proc, features.video, partner_tiles, captions, _repeat(range(B), G), ctx.decoding,
                        max_new_tokens=ctx.seg_answer_max_tokens, chunk_size=chunk)
        rollout = Rollout(group_size=G, old_logp=old_logp, ref_logp=ref_logp, action_mask=completions.completion_mask,
                          rewards=torch.full((B, G), float("nan")), is_truncated=completions.is_truncated,
                          max_action_length=cfg.max_completion_length, replay=replay, loop=self.name)
        return LoopRollout(rollout, reward_inputs(features, G, pred_masks=pred_masks, pred_captions=captions), stats)

    def region_prompts(self, features: StepFeatures) -> tuple[Tensor, Tensor]:
        """The B left-padded region-caption prompts ``[B, L]`` (model device) the policy answers: the region-token
        prompt of each sample's gt cells, or on the Qwen-VL family the caption question about its drawn image."""
        proc, model = self.ctx.processor, self.ctx.model
        if features.drawn_regions is not None:
            prompts = features.drawn_regions.caption_prompts(proc, range(features.num_samples))
        else:
            prompts = [proc.caption_prompt(features.n_tiles(features.image_of(b)), features.region_cells[b])
                       for b in range(features.num_samples)]
        ids, attention = proc.tokenize_prompts(prompts)
        return host_to_device([ids], model.device), host_to_device([attention], model.device)

    def _with_seg_prompts(self, replay: CaptionReplay, features: StepFeatures, captions: Sequence[str],
                          images: Sequence[int]) -> CaptionReplay:
        proc, G = self.ctx.processor, self.ctx.config.num_generations
        rows = _repeat(images, G)
        ids, attention = proc.tokenize_prompts([proc.segment_prompt(features.n_tiles(i), c or ".")
                                                for i, c in zip(rows, captions)])  # [N, L']
        device = replay.prompt_ids.device
        has_caption = torch.tensor([bool(c) for c in captions], dtype=torch.bool, device=device)
        return replace(replay, seg_prompt_ids=ids.to(device), seg_prompt_attention=attention.to(device),
                       has_caption=has_caption)


# ---- loop 2: the mask action ---------------------------------------------------------------------------------


@dataclass
class GroupedMaskHead(MaskHead):
    """A ``MaskHead`` whose N = B * G rows are B prompts repeated G times: the SAM2 decoder and the released chain at
    the region sample points run on the B distinct prompts only and their outputs are repeated (a group's G rollouts
    share one deterministic ``[SEG]``).

    Attributes (besides ``MaskHead``'s ``seg_prompt [N, C]``, ``decode`` and ``chain``, which stay N-row for perturbed
    prompts and painted masks): group_prompt ``[B, C]``, decode_groups (prompt ``[B, C]`` → decoder output of B rows),
    group_size G.
    """

    group_prompt: Tensor | None = None
    decode_groups: Callable | None = None
    group_size: int = 1

    @cached_property
    def group_decoded(self):
        """The decoder output of the B distinct prompts (fields ``[B, ...]``), computed once."""
        return self.decode_groups(self.group_prompt)

    @cached_property
    def decoded(self):
        out = self.group_decoded  # fields [B, ...]
        return replace(out, **{name: value.repeat_interleave(self.group_size, 0)  # [N, ...]
                               for name, value in vars(out).items() if torch.is_tensor(value)})

    @cached_property
    def region_logits(self) -> Tensor:
        chain = self.require_chain("region logits").every(self.group_size)  # B rows
        return chain.region_logits(self.group_decoded.best_logits).repeat_interleave(self.group_size, 0)  # [N, g, g]


def seg_mask_head(model, features: StepFeatures, tile_embeds: Tensor, replay: MaskReplay, samples: Sequence[int],
                  group_size: int) -> GroupedMaskHead:
    """The loop-2 policy head of n = b * G rows under the weights in effect.

    Teacher-forced pass over (RES prompt, fixed answer) for the b distinct prompts → final-norm hidden at the
    answer's ``[SEG]`` ``[b, D]`` → ``text_hidden_fcs`` → seg prompt ``[b, C]``; the SAM2 decoder runs on the
    step's cached image features when the mask policy asks for it. The head's ``chain`` holds the rows' image sizes,
    the SAM2 input size and the region grid g (g^2 = ``model.num_image_token``, the processor's tokens per tile;
    None for the Qwen-VL family, which has no region tokens).
    """
    G = group_size
    group_prompt = forced_answer_seg_prompts(model, features, tile_embeds, replay.prompt_ids[::G],
                                             replay.prompt_attention[::G], [features.image_of(s) for s in samples],
                                             replay.answer_ids[::G], replay.seg_index[::G])  # [b, C]
    return grouped_mask_head(model, features, replay, group_prompt, G)


def grouped_mask_head(model, features: StepFeatures, replay: MaskReplay, group_prompt: Tensor,
                      group_size: int) -> GroupedMaskHead:
    """The ``GroupedMaskHead`` of n = b * G rows from the b groups' seg prompts ``[b, C]``."""
    G = group_size
    image_index = replay.image_index  # [n]
    chain = MaskChain(sizes=tuple(tuple(features.image_sizes[i]) for i in image_index.tolist()),
                      sam_image_size=int(model.config.sam_image_size),
                      grid_size=None if is_qwen_vl_model(model) else math.isqrt(model.num_image_token))
    sam_rows = image_index if replay.grounding_index is None else replay.grounding_index  # video: the key frames

    def decode(prompt: Tensor):
        return model.decode_masks(prompt, features.grounding, sam_rows)

    def decode_groups(prompt: Tensor):
        return model.decode_masks(prompt, features.grounding, sam_rows[::G])

    return GroupedMaskHead(seg_prompt=group_prompt.repeat_interleave(G, 0), decode=decode, chain=chain,
                           group_prompt=group_prompt, decode_groups=decode_groups, group_size=G)


class CaptionToMaskLoop:
    """Loop 2 (caption → mask → caption'), reward 0.25 METEOR + 0.75 judge of the partner's caption by default."""

    name = "caption_to_mask"  # as MaskToCaptionLoop.name

    def __init__(self, ctx: CycleContext, composer, weight: float):
        self.ctx, self.composer, self.weight = ctx, composer, weight
        cfg = ctx.config  # one ratio per mask by default: the unit the reward scores
        self.loss_fn = PolicyLoss.from_config(cfg, cfg.mask_importance_sampling_level, cfg.mask_length_norm)

    def action_logp(self, model, features: StepFeatures, tile_embeds: Tensor, rollout: Rollout,
                    samples: Sequence[int]) -> Tensor:
        """Mask-action log-probs ``[n, T]`` (the policy's elements) of a (sliced) loop-2 rollout."""
        head = seg_mask_head(model, features, tile_embeds, rollout.replay, samples, rollout.group_size)
        return self.ctx.mask_policy.log_prob(head, rollout.replay.action)

    def loss_terms(self, model, features: StepFeatures, tile_embeds: Tensor, rollout: Rollout,
                   samples: Sequence[int], num_active_tokens: float | None,
                   logp: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """The loop's loss with grad: the clipped policy gradient on the sampled mask action (``logp`` as
        ``MaskToCaptionLoop.loss_terms``)."""
        if logp is None:
            logp = self.action_logp(model, features, tile_embeds, rollout, samples)
        return self.loss_fn(logp, rollout, num_active_tokens=num_active_tokens)

    def _replay(self, features: StepFeatures) -> MaskReplay:
        """N-row replay whose action is filled in once the policy has sampled."""
        proc, model, G = self.ctx.processor, self.ctx.model, self.ctx.config.num_generations
        ids, attention = proc.tokenize_prompts(grounding_prompts(proc, features))
        N = features.num_samples * G
        answer_ids = host_to_device([self.ctx.seg_answer_ids], model.device)
        return MaskReplay(prompt_ids=host_to_device([ids], model.device).repeat_interleave(G, 0),
                          prompt_attention=host_to_device([attention], model.device).repeat_interleave(G, 0),
                          answer_ids=answer_ids[None].expand(N, -1),
                          seg_index=torch.full((N,), self.ctx.seg_answer_index, device=model.device),
                          image_index=features.image_index.repeat_interleave(G), action=torch.empty(N))

    @torch.no_grad()
    def rollout(self, features: StepFeatures, *, needs_old_logp: bool, needs_ref_logp: bool = True) -> LoopRollout:
        """G sampled masks per gt caption (policy head on B rows, mask policy on N), their log-probs (kept as
        ``old_logp`` if needed), ``ref_logp`` (if beta > 0 and ``needs_ref_logp``), and the partner's caption' of
        each mask."""
        ctx, model, cfg, policy = self.ctx, self.ctx.model, self.ctx.config, self.ctx.mask_policy
        B, G, chunk = features.num_samples, cfg.num_generations, cfg.generation_chunk_size
        replay = self._replay(features)
        with eval_mode(model):
            tiles = model.project_vision(features.vit_tokens)
            video_stats, key_frames = {}, None
            if features.video is not None:
                replay, key_frames, video_stats = self._video_key_frames(features, tiles, replay)
            draws = []
            for b0, b1 in group_chunks(B, G, chunk):
                head = seg_mask_head(model, features, tiles, slice_rows(replay, b0 * G, b1 * G), range(b0, b1), G)
                action, logp = policy.sample(head, generator=ctx.generator)
                draws.append((action, logp, to_host(policy.pred_masks(head, action))))  # n x bool [H, W]
            actions, logps, masks = zip(*draws)
            action, logp = torch.cat(actions), torch.cat(logps)  # [N, ...], [N, T]
            pred_masks = [m for rows in masks for m in rows]  # N x bool [H, W]
            replay = replace(replay, action=action)
            ref_logp = None
            if cfg.beta > 0 and needs_ref_logp:
                with ctx.weights.reference(model):
                    ref_tiles = model.project_vision(features.vit_tokens)
                    ref_logp = cat_chunks(lambda b0, b1: policy.log_prob(seg_mask_head(
                        model, features, ref_tiles, slice_rows(replay, b0 * G, b1 * G), range(b0, b1), G),
                        action[b0 * G:b1 * G]), B, G, chunk)
            if features.video is None:
                described, described_rows = features, _repeat([features.image_of(b) for b in range(B)], G)
            else:  # the partner sees the key frame as a one-tile image, the policy's mask as its region
                described = features.video.encoded.frame_images(features.video.clip_index, key_frames)
                described_rows = _repeat(range(B), G)
            captions, stats = _partner_captions(ctx, features, described, described_rows, pred_masks, G, chunk)
        stats.update(video_stats)
        stats["mask/area_frac"] = float(sum(m.float().mean() for m in pred_masks) / len(pred_masks))
        rollout = Rollout(group_size=G, old_logp=logp if needs_old_logp else None, ref_logp=ref_logp,
                          action_mask=torch.ones_like(logp, dtype=torch.bool), rewards=torch.full((B, G), float("nan")),
                          is_truncated=torch.zeros(B * G, dtype=torch.bool, device=logp.device),
                          max_action_length=logp.shape[1], replay=replay, loop=self.name)
        inputs = reward_inputs(features, G, pred_masks=pred_masks, pred_captions=captions)
        if key_frames is not None:  # rewards see the frame the action was taken on: its gt mask and its pixels
            inputs = replace(inputs, gt_masks=_repeat([None if m is None else m[k] for m, k in
                                                       zip(features.gt_masks, key_frames)], G),
                             images=_repeat([s.frames[k] for s, k in zip(features.samples, key_frames)], G))
        return LoopRollout(rollout, inputs, stats)


    def _video_key_frames(self, features: StepFeatures, tile_embeds: Tensor, replay: MaskReplay
                          ) -> tuple[MaskReplay, list[int], dict[str, float]]:
        """A video step's action frame per sample (module docstring): the MLLM frame where the policy's
        deterministic mask (teacher-forced ``[SEG]`` prompt, decoder on that frame) is largest, stored in the
        replay's ``grounding_index`` so that every later scoring decodes on the same frame. Also the policy's whole
        masklet (that prompt propagated over the clip) scored against the gt masklet: ``video/policy_jf`` (a
        statistic, not a reward), over the samples that have a masklet."""
        model, G, video = self.ctx.model, self.ctx.config.num_generations, features.video
        B = features.num_samples
        prompts = forced_answer_seg_prompts(model, features, tile_embeds, replay.prompt_ids[::G],
                                            replay.prompt_attention[::G], features.image_index.tolist(),
                                            replay.answer_ids[::G], replay.seg_index[::G])  # [B, C]
        clips = video.encoded
        key_frames = largest_mask_frames(model, clips, video.clip_index, prompts)
        rows = [clips.frame_start[c] + k for c, k in zip(video.clip_index, key_frames)]
        grounding_index = torch.tensor(rows, dtype=torch.long, device=replay.image_index.device)
        gts, masklets = [], []  # the masklets stay on the model's device: J&F counts there
        for b in range(B):
            if features.gt_masks[b] is None:
                continue
            clip = clips.video(video.clip_index[b])
            logits = video_masklet_logits(model, clip, prompts[b:b + 1])[0]  # [T, h, w]
            gts.append(features.gt_masks[b])
            masklets.append(masklet_masks(model, logits, clip.size))
        stats = {"video/key_frame": sum(key_frames) / B}
        if masklets:
            stats["video/policy_jf"] = sum(s.j_and_f for s in score_masklets(gts, masklets)) / len(masklets)
        return replace(replay, grounding_index=grounding_index.repeat_interleave(G)), key_frames, stats


def grounding_prompts(processor, features: StepFeatures) -> list[str]:
    """Loop 2's RES prompt of each sample's text: about its image, or (video step) about its clip's MLLM frames."""
    if features.video is None:
        return [processor.segment_prompt(features.n_tiles(features.image_of(b)), text)
                for b, text in enumerate(features.prompt_texts)]
    return [processor.video_segment_prompt(features.n_tiles(features.image_of(b)), text)
            for b, text in enumerate(features.prompt_texts)]


# ---- both loops over one image prefix ---------------------------------------------------------------------------


def caption_prefix_lengths(region_ids: Tensor, region_attention: Tensor, grounding_ids: Tensor,
                           grounding_attention: Tensor) -> Tensor:
    """``MaskReplay.caption_prefix`` of B samples: ``[B, 2]`` long (P, S) from their loop-1 region prompts ``[B, L1]``
    and loop-2 RES prompts ``[B, L2]`` (host tensors, left padded). P is the length of the two prompts' common start
    over their real tokens, S the RES prompt's real tokens after it.

    Equal token ids at equal positions have equal states: image tokens take their image's tile embeddings in order in
    both prompts (the RES prompt holds no other image token, so a region token is never in the common start), and
    causal attention keeps later tokens from changing them."""
    lengths = []
    for region, region_real, grounding, grounding_real in zip(region_ids, region_attention, grounding_ids,
                                                              grounding_attention):
        region, grounding = region[region_real.bool()], grounding[grounding_real.bool()]
        n = min(len(region), len(grounding))
        differs = (region[:n] != grounding[:n]).nonzero().flatten()
        common = int(differs[0]) if len(differs) else n
        lengths.append((common, len(grounding) - common))
    return torch.tensor(lengths, dtype=torch.long).reshape(-1, 2)


def _grounding_branch(model, replay: MaskReplay, region_attention: Tensor, group_size: int,
                      length_multiple: int | None) -> tuple[Branch, Tensor]:
    """Loop 2's b groups as a branch over loop 1's b region prompts (``region_attention [b, L1]``): per sample, its
    RES prompt's S tokens after the common start, then the forced answer, at positions P, P + 1, ..; the rows read
    the first P real keys of the region prompt. The branch is right padded to a multiple of ``length_multiple`` (the
    prompts' length buckets). Returns the branch and each row's ``[SEG]`` column ``[b]``.

    The image block lies in the common start (:func:`caption_prefix_lengths`), so the branch's tokens are text: their
    embeddings are the LM's token embeddings, with no image rows to fill and drop."""
    G, device = group_size, region_attention.device
    common, own = replay.caption_prefix[::G].unbind(1)  # [b] each, host
    ids, answers = replay.prompt_ids[::G], replay.answer_ids[::G]  # [b, L2], [b, A]
    L2, A = ids.shape[1], answers.shape[1]
    offsets = torch.arange(bucket_length(int(own.max()) + A, length_multiple))  # [T] host
    is_real = offsets[None] < (own + A)[:, None]  # [b, T]
    columns = torch.where(is_real, L2 - own[:, None] + offsets[None], 0)  # [b, T] into [prompt | answer]
    columns, is_real, positions, common, own = (host_to_device([t], device) for t in (
        columns, is_real, common[:, None] + offsets[None], common, own))
    branch_ids = torch.cat([ids, answers], 1).gather(1, columns)  # [b, T]
    visible = region_attention.bool() & (region_attention.long().cumsum(1) <= common[:, None])  # [b, L1]
    branch = Branch(embeds=model.language_model.get_input_embeddings()(branch_ids), mask=is_real,
                    rows_per_prefix=1, positions=positions, prefix_visible=visible)
    return branch, own + replay.seg_index[::G]


def joint_action_logps(ctx: CycleContext, model, features: StepFeatures, tile_embeds: Tensor, captions: Rollout,
                       masks: Rollout, samples: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Both loops' action log-probs of the same b samples from one pass (``GRPOConfig.joint_loop_scoring``): loop 1's
    caption tokens ``[n, T1]`` (as :func:`caption_logp`) and loop 2's mask action ``[n, T2]`` (as
    ``CaptionToMaskLoop.action_logp``), under the weights in effect, with grad outside ``no_grad``.

    The b region prompts run once as the prefix; two branches read it (``grouped_scoring.branched_hidden``): the n
    captions (all of their prompt's keys) and the b RES prompts from the end of their image block on (the first
    ``caption_prefix`` P keys), answered with the forced answer. A sample's image block, ~1,300 tokens at 896 px,
    so runs once for both loops instead of once per loop; the values equal the separate passes up to float order.
    Needs ``masks.replay.caption_prefix``."""
    cfg, G, lm = ctx.config, captions.group_size, model.language_model
    regions, grounding = captions.replay, masks.replay
    embeds = region_prompt_embeds(model, features, tile_embeds, regions, samples, G)  # [b, L1, D]
    attention = regions.prompt_attention[::G]  # [b, L1]
    completion_ids, completion_mask = regions.completion_ids, captions.action_mask  # [n, T1]
    caption_branch = completion_branch(lm, attention, completion_ids[:, :-1], completion_mask, G)
    seg_branch, seg_columns = _grounding_branch(model, grounding, attention, G, ctx.processor.prompt_length_multiple)
    last, (caption_states, seg_states) = branched_hidden(lm, embeds, attention, [caption_branch, seg_branch])
    caption_logp = completion_logprobs_from_states(lm, last, caption_states, completion_ids, completion_mask, G,
                                                   temperature=cfg.temperature, logprob_head=cfg.logprob_head)
    rows = torch.arange(len(samples), device=seg_states.device)
    group_prompt = model.seg_hidden_to_prompt(seg_states[rows, seg_columns])  # [b, C]
    head = grouped_mask_head(model, features, grounding, group_prompt, G)
    return caption_logp, ctx.mask_policy.log_prob(head, grounding.action)


# ---- loop 2, deterministic mask: the answer-text action ------------------------------------------------------


def answer_logp_and_seg_logits(model, features: StepFeatures, tile_embeds: Tensor, replay: AnswerReplay,
                               completion_mask: Tensor, samples: Sequence[int], group_size: int,
                               temperature: float, logprob_head: str) -> tuple[Tensor, Tensor, Tensor]:
    """One teacher-forced pass over (RES prompt, sampled answer) of n = b * G rows under the weights in effect:
    ``(token_logp [n, T], rows [m], seg_logits [m, h, w])``, the answer tokens' log-probs (prompt run once per
    group) and the mask logits of the m rows whose answer feeds back a ``[SEG]`` (its state → ``text_hidden_fcs``
    → SAM2 decoder on the cached features). Carries grad outside ``no_grad``."""
    G = group_size
    embeds = prompt_embeds(model, features, tile_embeds, replay.prompt_ids[::G],
                           [features.image_of(s) for s in samples])  # [b, L, D]
    logp, hidden = grouped_completion_logprobs(model.language_model, embeds, replay.prompt_attention[::G],
                                               replay.completion_ids, completion_mask, num_generations=G,
                                               temperature=temperature, return_hidden=True,
                                               logprob_head=logprob_head)  # [n, T], [n, T, D]
    rows = torch.nonzero(replay.seg_position >= 0).flatten()  # [m]
    seg_hidden = hidden[rows, replay.seg_position[rows]]  # [m, D]
    seg_logits = model.decode_masks(model.seg_hidden_to_prompt(seg_hidden), features.grounding,
                                    replay.image_index[rows]).best_logits  # [m, h, w]
    return logp, rows, seg_logits


class AnswerToMaskLoop:
    """Loop 2 (caption → mask → caption') with a deterministic mask (``mask_policy='deterministic'``).

    The policy samples G answers to the RES prompt of the gt caption (as upstream's GRPO recipes for ``[SEG]``
    models do: the action is the answer text, ``[SEG]`` included); each answer's mask is the greedy mask of its
    first fed-back ``[SEG]`` (no sampled mask cells); the partner describes it; the reward scores the description.
    The policy gradient runs on the answer tokens (``importance_sampling_level``, as loop 1's captions); an answer
    without ``[SEG]`` gets an empty mask. With ``caption_to_mask_dense_weight > 0`` a Dice + BCE self-training loss
    pulls every rollout's mask logits toward the mask of its group's best-scored member (grpo/dense.py).

    Same name, rewards and metrics as ``CaptionToMaskLoop``: it is the other action of the same loop.
    """

    name = CaptionToMaskLoop.name

    def __init__(self, ctx: CycleContext, composer, weight: float):
        self.ctx, self.composer, self.weight = ctx, composer, weight
        self.loss_fn = PolicyLoss.from_config(ctx.config)  # token-level text action, like loop 1
        self.dense_weight = float(ctx.config.caption_to_mask_dense_weight)

    def _terms(self, model, features: StepFeatures, tile_embeds: Tensor, rollout: Rollout, samples: Sequence[int]):
        return answer_logp_and_seg_logits(model, features, tile_embeds, rollout.replay, rollout.action_mask, samples,
                                          rollout.group_size, self.ctx.config.temperature,
                                          self.ctx.config.logprob_head)

    def action_logp(self, model, features: StepFeatures, tile_embeds: Tensor, rollout: Rollout,
                    samples: Sequence[int]) -> Tensor:
        """Answer-token log-probs ``[n, T]`` of a (sliced) rollout; carries grad outside ``no_grad``."""
        return self._terms(model, features, tile_embeds, rollout, samples)[0]

    def loss_terms(self, model, features: StepFeatures, tile_embeds: Tensor, rollout: Rollout,
                   samples: Sequence[int], num_active_tokens: float | None) -> tuple[Tensor, dict[str, Tensor]]:
        """Clipped policy gradient on the answer tokens, plus ``caption_to_mask_dense_weight`` times the
        self-training loss, both from one teacher-forced pass.

        Self-training stats: ``dense_term`` (the unweighted loss), ``dense_frac`` (share of rollouts pulled),
        ``dense_iou`` (IoU of their masks with the target, low-res)."""
        logp, rows, seg_logits = self._terms(model, features, tile_embeds, rollout, samples)
        loss, stats = self.loss_fn(logp, rollout, num_active_tokens=num_active_tokens)
        if self.dense_weight > 0:
            dense, dense_stats = self.self_training_loss(seg_logits, rows, rollout)
            loss = loss + self.dense_weight * dense
            stats.update(dense_stats)
        return loss, stats

    def self_training_targets(self, rows: Tensor, rollout: Rollout) -> tuple[Tensor, Tensor]:
        """``(pulled [m] bool, targets [m, h, w] bool)`` for the m rows with a mask: a row is pulled when its group's
        rewards differ, toward the stored mask of the group's best-scored member."""
        G = rollout.group_size
        best, has_spread = best_in_group(rollout.rewards)  # [b], [b]
        groups = (rows // G).cpu()  # [m]
        pulled = has_spread[groups].to(rows.device)  # [m]
        best_rows = groups * G + best[groups]  # [m]
        return pulled, rollout.replay.seg_mask[best_rows.to(rollout.replay.seg_mask.device)]

    def self_training_loss(self, seg_logits: Tensor, rows: Tensor, rollout: Rollout
                           ) -> tuple[Tensor, dict[str, Tensor]]:
        pulled, targets = self.self_training_targets(rows, rollout)
        zero = seg_logits.sum() * 0.0
        if not bool(pulled.any()):
            return zero, {"dense_term": zero.detach(), "dense_frac": zero.detach(), "dense_iou": zero.detach()}
        logits, target = seg_logits[pulled], targets[pulled]  # [k, h, w]
        per_mask = mask_loss_per_mask(logits, target.float(), num_points=self.ctx.config.dense_num_points,
                                      generator=self.ctx.generator)  # [k]
        dense = per_mask.mean()
        with torch.no_grad():
            stats = {"dense_term": dense.detach(), "dense_frac": torch.tensor(len(logits) / rollout.num_rollouts),
                     "dense_iou": mask_iou(logits, target)}
        return dense, stats

    def _replay(self, features: StepFeatures) -> tuple[Tensor, Tensor]:
        proc, model = self.ctx.processor, self.ctx.model
        ids, attention = proc.tokenize_prompts(
            [proc.segment_prompt(features.n_tiles(features.image_of(b)), text)
             for b, text in enumerate(features.prompt_texts)])
        return ids.to(model.device), attention.to(model.device)  # [B, L]

    @torch.no_grad()
    def rollout(self, features: StepFeatures, *, needs_old_logp: bool, needs_ref_logp: bool = True) -> LoopRollout:
        """G sampled answers per gt caption (policy), their greedy ``[SEG]`` masks, ``old_logp`` (if needed),
        ``ref_logp`` (if beta > 0 and ``needs_ref_logp``), and the partner's caption' of each mask."""
        ctx, model, cfg = self.ctx, self.ctx.model, self.ctx.config
        B, G, chunk = features.num_samples, cfg.num_generations, cfg.generation_chunk_size
        if features.video is not None:
            raise ValueError(f"{self.name} loop: mask_policy='deterministic' is not supported on video steps (e.g. "
                             f"sample {features.sample_ids[0]!r}); use a stochastic mask policy such as 'region'.")
        images = features.image_index.tolist()
        ids, attention = self._replay(features)
        with eval_mode(model):
            tiles = model.project_vision(features.vit_tokens)
            embeds = prompt_embeds(model, features, tiles, ids, images)  # [B, L, D]
            completions = sample_text(model, embeds, attention, ctx.decoding, num_generations=G,
                                      max_new_tokens=cfg.max_completion_length, do_sample=True,
                                      temperature=cfg.temperature, top_p=cfg.top_p, chunk_size=chunk,
                                      generator=ctx.generator)  # ids [N, T]
            positions = fed_back_seg_positions(completions, model.seg_token_id)
            seg_position = torch.tensor([p[0] if p else -1 for p in positions], device=model.device)  # [N]
            replay = AnswerReplay(prompt_ids=ids.repeat_interleave(G, 0),
                                  prompt_attention=attention.repeat_interleave(G, 0),
                                  completion_ids=completions.ids, image_index=features.image_index.repeat_interleave(G),
                                  seg_position=seg_position)

            def terms(tile_embeds: Tensor, b0: int, b1: int):
                return answer_logp_and_seg_logits(model, features, tile_embeds, slice_rows(replay, b0 * G, b1 * G),
                                                  completions.completion_mask[b0 * G:b1 * G], range(b0, b1), G,
                                                  cfg.temperature, cfg.logprob_head)

            logps, seg_masks, pred_masks = [], [], []
            for b0, b1 in group_chunks(B, G, chunk):
                logp, rows, seg_logits = terms(tiles, b0, b1)  # rows are local to the chunk
                logps.append(logp)
                h, w = seg_logits.shape[-2:] if len(rows) else _low_res_size(model)
                low_res = torch.zeros((b1 - b0) * G, h, w, dtype=torch.bool, device=logp.device)
                low_res[rows] = seg_logits > 0
                seg_masks.append(low_res)
                sizes = [features.image_sizes[images[(b0 * G + n) // G]] for n in range((b1 - b0) * G)]
                masks = [torch.zeros(size, dtype=torch.bool) for size in sizes]
                for n, mask in zip(rows.tolist(), model.logits_to_masks(seg_logits, [sizes[n] for n in rows.tolist()])):
                    masks[n] = mask.cpu()
                pred_masks += masks
            logp = torch.cat(logps)  # [N, T]
            replay = replace(replay, seg_mask=torch.cat(seg_masks))  # [N, h, w]
            ref_logp = None
            if cfg.beta > 0 and needs_ref_logp:
                with ctx.weights.reference(model):
                    ref_tiles = model.project_vision(features.vit_tokens)
                    ref_logp = cat_chunks(lambda b0, b1: terms(ref_tiles, b0, b1)[0], B, G, chunk)
            captions, stats = _partner_captions(ctx, features, features, replay.image_index.tolist(), pred_masks, G,
                                                chunk)
        stats["mask/area_frac"] = float(sum(m.float().mean() for m in pred_masks) / len(pred_masks))
        stats["answer/no_seg"] = float((seg_position < 0).sum())
        rollout = Rollout(group_size=G, old_logp=logp if needs_old_logp else None, ref_logp=ref_logp,
                          action_mask=completions.completion_mask, rewards=torch.full((B, G), float("nan")),
                          is_truncated=completions.is_truncated, max_action_length=cfg.max_completion_length,
                          replay=replay, loop=self.name)
        return LoopRollout(rollout, reward_inputs(features, G, pred_masks=pred_masks, pred_captions=captions), stats)


def _low_res_size(model) -> tuple[int, int]:
    """(h, w) of the SAM2 decoder's low-res logits: 4 x the image-embedding side."""
    sam = model.grounding_encoder.sam2_model
    side = sam.image_size // sam.backbone_stride * 4
    return side, side
