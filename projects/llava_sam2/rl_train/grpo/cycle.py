"""The two cycle loops of DESIGN §3: each samples its action with the policy, scores it under the reference, lets
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

Each loop's ``action_logp`` is the single function that scores a given action (CleanRL's
``get_action_and_value``): the rollout calls it (no grad) for ``old_logp`` and, inside ``WeightSets.reference``,
for ``ref_logp``; the loss calls it with grad (through the loop's own ``loss_fn``). The sampling pass builds the same
prompt embeddings / mask head.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import torch
from torch import Tensor

from ..model.decoding import TextDecoding, completion_texts, eval_mode, group_chunks, sample_text
from ..model.grouped_scoring import grouped_completion_logprobs
from ..model.pipeline import forced_seg_prompts, prompt_embeds
from ..model.region_chain import MaskChain
from ..rewards.base import RewardInputs
from .features import StepFeatures
from .losses import PolicyLoss
from .mask_policy import MaskHead
from .passes import cat_chunks, partner_describe, partner_segment, slice_rows
from .rollout import CaptionReplay, MaskReplay, Rollout


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


def _repeat(items: Sequence, G: int) -> list:
    """``[x_0]*G + [x_1]*G + ...``: per-sample values laid out per rollout (n = b * G + g)."""
    return [x for x in items for _ in range(G)]


def reward_inputs(features: StepFeatures, G: int, pred_masks=None, pred_captions=None) -> RewardInputs:
    """N-row reward inputs: the step's targets repeated per rollout plus a loop's predictions."""
    return RewardInputs(sample_ids=_repeat(features.sample_ids, G), pred_masks=pred_masks,
                        gt_masks=_repeat(features.gt_masks, G), pred_captions=pred_captions,
                        gt_captions=_repeat(features.references, G),
                        images=_repeat([s.image for s in features.samples], G))


# ---- loop 1: the caption action ------------------------------------------------------------------------------


def caption_logp(model, features: StepFeatures, tile_embeds: Tensor, replay: CaptionReplay, completion_mask: Tensor,
                 samples: Sequence[int], group_size: int, temperature: float) -> Tensor:
    """log pi(c_t | region prompt, c_<t) of stored caption tokens under the weights in effect: ``[n, T]``.

    The n = b * G rows hold b prompts repeated G times; the prompt embeddings are built for the b distinct prompts
    (image tokens + region tokens from ``tile_embeds``), and each prompt runs once for its G captions
    (``grouped_completion_logprobs``: b·L + n·T tokens, not n·(L + T), gradient through the shared prompt) at the
    sampling temperature. ``old_logp``, ``ref_logp`` and the loss all score through here, so the first ratio is 1.
    """
    G = group_size
    cells = features.region_cells[list(samples)]  # [b, g, g]
    embeds = prompt_embeds(model, features, tile_embeds, replay.prompt_ids[::G],
                           [features.image_of(s) for s in samples], list(cells))  # [b, L, D]
    return grouped_completion_logprobs(model.language_model, embeds, replay.prompt_attention[::G],
                                       replay.completion_ids, completion_mask, num_generations=G,
                                       temperature=temperature)  # [n, T]


class MaskToCaptionLoop:
    """Loop 1 (mask → caption → mask'), reward IoU(gt_mask, partner mask') by default."""

    name = "mask_to_caption"  # the loop's one name: config knobs (<name>_weight, rewards key), metrics (<name>/...)

    def __init__(self, ctx: CycleContext, composer, weight: float):
        self.ctx, self.composer, self.weight = ctx, composer, weight
        self.loss_fn = PolicyLoss.from_config(ctx.config)  # importance_sampling_level, TRL's meaning

    def action_logp(self, model, features: StepFeatures, tile_embeds: Tensor, rollout: Rollout,
                    samples: Sequence[int]) -> Tensor:
        """Caption-token log-probs ``[n, T]`` of a (sliced) loop-1 rollout; carries grad outside ``no_grad``."""
        return caption_logp(model, features, tile_embeds, rollout.replay, rollout.action_mask, samples,
                            rollout.group_size, self.ctx.config.temperature)

    @torch.no_grad()
    def rollout(self, features: StepFeatures, *, needs_old_logp: bool) -> LoopRollout:
        """G sampled captions per gt region (policy), their ``old_logp`` (if needed) and ``ref_logp`` (if beta > 0),
        and the partner's mask' for each; rewards are left NaN for ``CycleGRPO.score``."""
        ctx, model, proc, cfg = self.ctx, self.ctx.model, self.ctx.processor, self.ctx.config
        B, G, chunk = features.num_samples, cfg.num_generations, cfg.generation_chunk_size
        images = features.image_index.tolist()
        ids, attention = proc.tokenize_prompts(
            [proc.caption_prompt(features.n_tiles(i), features.region_cells[b]) for b, i in enumerate(images)])
        ids, attention = ids.to(model.device), attention.to(model.device)  # [B, L]
        with eval_mode(model):
            tiles = model.project_vision(features.vit_tokens)  # [n_tiles, t, D]
            embeds = prompt_embeds(model, features, tiles, ids, images, list(features.region_cells))  # [B, L, D]
            completions = sample_text(  # B prompts, G samples each (prefilled once per prompt on the fast path)
                model, embeds, attention, ctx.decoding, num_generations=G, max_new_tokens=cfg.max_completion_length,
                do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, chunk_size=chunk,
                generator=ctx.generator)  # ids [N, T]
            replay = CaptionReplay(prompt_ids=ids.repeat_interleave(G, 0),
                                   prompt_attention=attention.repeat_interleave(G, 0), completion_ids=completions.ids,
                                   image_index=features.image_index.repeat_interleave(G))

            def score(tile_embeds: Tensor) -> Callable[[int, int], Tensor]:
                return lambda b0, b1: caption_logp(
                    model, features, tile_embeds, slice_rows(replay, b0 * G, b1 * G),
                    completions.completion_mask[b0 * G:b1 * G], range(b0, b1), G, cfg.temperature)

            # old_logp must equal the loss pass's values bit for bit (ratio 1): the loss scores through caption_logp too
            old_logp = cat_chunks(score(tiles), B, G, chunk) if needs_old_logp else None
            ref_logp = None
            if cfg.beta > 0:
                with ctx.weights.reference(model):
                    ref_logp = cat_chunks(score(model.project_vision(features.vit_tokens)), B, G, chunk)
            captions = completion_texts(completions, ctx.decoding)
            with ctx.weights.partner(model):
                pred_masks, stats = partner_segment(
                    model, proc, features, model.project_vision(features.vit_tokens), captions, _repeat(images, G),
                    ctx.decoding, max_new_tokens=ctx.seg_answer_max_tokens, chunk_size=chunk)
        rollout = Rollout(group_size=G, old_logp=old_logp, ref_logp=ref_logp, action_mask=completions.completion_mask,
                          rewards=torch.full((B, G), float("nan")), is_truncated=completions.is_truncated,
                          max_action_length=cfg.max_completion_length, replay=replay, loop=self.name)
        return LoopRollout(rollout, reward_inputs(features, G, pred_masks=pred_masks, pred_captions=captions), stats)


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
    the SAM2 input size and the region grid g (g^2 = ``model.num_image_token``, the processor's tokens per tile).
    """
    G = group_size
    embeds = prompt_embeds(model, features, tile_embeds, replay.prompt_ids[::G],
                           [features.image_of(s) for s in samples])  # [b, L, D]
    group_prompt = forced_seg_prompts(model, embeds, replay.prompt_attention[::G], replay.answer_ids[::G],
                                      replay.seg_index[::G])  # [b, C]
    image_index = replay.image_index  # [n]
    chain = MaskChain(sizes=tuple(tuple(features.image_sizes[i]) for i in image_index.tolist()),
                      sam_image_size=int(model.config.sam_image_size), grid_size=math.isqrt(model.num_image_token))

    def decode(prompt: Tensor):
        return model.decode_masks(prompt, features.grounding, image_index)

    def decode_groups(prompt: Tensor):
        return model.decode_masks(prompt, features.grounding, image_index[::G])

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

    def _replay(self, features: StepFeatures) -> MaskReplay:
        """N-row replay whose action is filled in once the policy has sampled."""
        proc, model, G = self.ctx.processor, self.ctx.model, self.ctx.config.num_generations
        ids, attention = proc.tokenize_prompts(
            [proc.segment_prompt(features.n_tiles(features.image_of(b)), text)
             for b, text in enumerate(features.prompt_texts)])
        N = features.num_samples * G
        answer_ids = self.ctx.seg_answer_ids.to(model.device)
        return MaskReplay(prompt_ids=ids.to(model.device).repeat_interleave(G, 0),
                          prompt_attention=attention.to(model.device).repeat_interleave(G, 0),
                          answer_ids=answer_ids[None].expand(N, -1),
                          seg_index=torch.full((N,), self.ctx.seg_answer_index, device=model.device),
                          image_index=features.image_index.repeat_interleave(G), action=torch.empty(N))

    @torch.no_grad()
    def rollout(self, features: StepFeatures, *, needs_old_logp: bool) -> LoopRollout:
        """G sampled masks per gt caption (policy head on B rows, mask policy on N), their log-probs (kept as
        ``old_logp`` if needed), ``ref_logp`` (if beta > 0), and the partner's caption' of each mask."""
        ctx, model, cfg, policy = self.ctx, self.ctx.model, self.ctx.config, self.ctx.mask_policy
        B, G, chunk = features.num_samples, cfg.num_generations, cfg.generation_chunk_size
        replay = self._replay(features)
        with eval_mode(model):
            tiles = model.project_vision(features.vit_tokens)
            draws = []
            for b0, b1 in group_chunks(B, G, chunk):
                head = seg_mask_head(model, features, tiles, slice_rows(replay, b0 * G, b1 * G), range(b0, b1), G)
                action, logp = policy.sample(head, generator=ctx.generator)
                draws.append((action, logp, [m.cpu() for m in policy.pred_masks(head, action)]))  # n x bool [H, W]
            actions, logps, masks = zip(*draws)
            action, logp = torch.cat(actions), torch.cat(logps)  # [N, ...], [N, T]
            pred_masks = [m for rows in masks for m in rows]  # N x bool [H, W]
            replay = replace(replay, action=action)
            ref_logp = None
            if cfg.beta > 0:
                with ctx.weights.reference(model):
                    ref_tiles = model.project_vision(features.vit_tokens)
                    ref_logp = cat_chunks(lambda b0, b1: policy.log_prob(seg_mask_head(
                        model, features, ref_tiles, slice_rows(replay, b0 * G, b1 * G), range(b0, b1), G),
                        action[b0 * G:b1 * G]), B, G, chunk)
            captions, stats = None, {}
            if ctx.use_partner_captions:
                with ctx.weights.partner(model):
                    captions, stats = partner_describe(
                        model, ctx.processor, features, model.project_vision(features.vit_tokens), pred_masks,
                        replay.image_index.tolist(), _repeat(features.sample_ids, G), ctx.decoding,
                        max_new_tokens=cfg.max_completion_length, chunk_size=chunk)
        stats["mask/area_frac"] = float(sum(m.float().mean() for m in pred_masks) / len(pred_masks))
        rollout = Rollout(group_size=G, old_logp=logp if needs_old_logp else None, ref_logp=ref_logp,
                          action_mask=torch.ones_like(logp, dtype=torch.bool), rewards=torch.full((B, G), float("nan")),
                          is_truncated=torch.zeros(B * G, dtype=torch.bool, device=logp.device),
                          max_action_length=logp.shape[1], replay=replay, loop=self.name)
        return LoopRollout(rollout, reward_inputs(features, G, pred_masks=pred_masks, pred_captions=captions), stats)
