"""The two baselines of ``sa2va-rl bench rl-step`` (rl_step.py; issue #8), HF ``generate()`` as a decoder and the
naive step, and the bench's random-weight stand-ins (a caption reward without network, captions folded into the tiny
vocab).

* :func:`hf_generate_completions` decodes with transformers' ``lm.generate`` (eager, dynamic cache) on the N = B·G
  repeated rows. Registered as a ``DECODE_BACKENDS`` entry it turns our step into baseline (b): batched
  ``generate()`` for the policy and partner passes, encoders once per image, weight-set partner.
* :class:`NaiveStep` is baseline (a), shaped like the seeds' plan: every rollout on its own (batch 1) with
  ``generate(output_scores=True, return_dict_in_generate=True)``, the frozen encoders re-run for each rollout and
  each model that looks at it, the partner a ``copy.deepcopy`` of the whole model updated by a per-tensor EMA over
  all parameters (MMEngine's ``BaseAveragedModel`` way), and a batch-1 teacher-forced forward/backward per rollout.
  It runs K rollouts per loop and extrapolates the per-rollout phases to N (clearly labelled).
"""
from __future__ import annotations

import copy
from dataclasses import replace

import torch
from torch import Tensor

from projects.llava_sam2.rl_train.grpo.cycle import seg_mask_head
from projects.llava_sam2.rl_train.grpo.features import encode_step
from projects.llava_sam2.rl_train.grpo.passes import partner_describe, partner_segment
from projects.llava_sam2.rl_train.grpo.rollout import MaskReplay
from projects.llava_sam2.rl_train.grpo.weights import mmengine_momentum
from projects.llava_sam2.rl_train.model.decoding.generation import Completions, completion_logprobs
from projects.llava_sam2.rl_train.model.decoding.text_decoding import eval_mode, sample_text
from projects.llava_sam2.rl_train.model.pipeline.shared import prompt_embeds
from projects.llava_sam2.rl_train.rewards.base import RewardInputs


class StubCaptionReward:
    """Token-overlap F1 of the partner's caption with the reference (a no-network stand-in for METEOR + judge)."""

    name, weight = "stub_caption", 1.0

    def __call__(self, inputs):
        values = []
        for pred, refs in zip(inputs.pred_captions, inputs.gt_captions):
            p, r = set(pred.lower().split()), set((refs[0] if refs else "").lower().split())
            common = len(p & r)
            values.append(0.0 if not common else 2 * common / (len(p) + len(r)))
        return values


def folded_texts(tokenizer, completion_texts):
    """``completion_texts`` with ids folded into the tokenizer's range (random weights sample the full vocab)."""
    vocab = len(tokenizer)

    def texts(completions, decoding):
        folded = completions.ids % vocab
        return completion_texts(type(completions)(folded, completions.completion_mask, completions.is_truncated,
                                                  completions.token_logp), decoding)
    return texts


HF_GENERATE, HF_GENERATE_SCORES = "hf_generate", "hf_generate_scores"  # DECODE_BACKENDS names (bench only)
PER_ITERATION_PHASES = ("optimizer", "ema_partner")  # not scaled by N / K


@torch.no_grad()
def hf_generate_completions(lm, inputs_embeds: Tensor, attention_mask: Tensor, *, num_generations: int = 1,
                            max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0, do_sample: bool = True,
                            stop_token_ids, pad_token_id: int = 0, generator=None, return_hidden: bool = False,
                            output_scores: bool = False, prefix=None, logits_processor=None) -> Completions:
    """``lm.generate`` on the B·G repeated rows, as ``Completions`` (``generator`` is unused: generate draws from
    torch's global RNG; ``return_hidden`` is ignored: ``hidden`` stays None, so the ``[SEG]`` passes re-run
    prompt + answer teacher-forced, as the seeds' plan did; a ``prefix`` is joined to every row, each row prefilled
    whole). ``output_scores`` also returns the processed scores, whose log-softmax fills ``token_logp`` (what the
    seeds' plan used as old log-probs); otherwise it is 0. ``logits_processor``: extra transformers processors."""
    if prefix is not None:
        inputs_embeds, attention_mask = prefix.full_prompts(inputs_embeds, attention_mask)  # [B, P + S, ...]
    rows = inputs_embeds.repeat_interleave(num_generations, 0), attention_mask.repeat_interleave(num_generations, 0)
    sampling = (dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if do_sample
                else dict(do_sample=False, temperature=None, top_p=None, top_k=None))
    out = lm.generate(inputs_embeds=rows[0], attention_mask=rows[1], max_new_tokens=max_new_tokens,
                      eos_token_id=list(stop_token_ids), pad_token_id=pad_token_id, output_scores=output_scores,
                      return_dict_in_generate=True, logits_processor=logits_processor, **sampling)
    ids = out.sequences  # [N, T]: only new tokens when prompted with inputs_embeds
    is_stop = torch.isin(ids, torch.as_tensor(list(stop_token_ids), device=ids.device))  # [N, T]
    has_stop = is_stop.any(-1)  # [N]
    last = torch.where(has_stop, is_stop.int().argmax(-1), ids.shape[1] - 1)  # [N] last kept column
    completion_mask = torch.arange(ids.shape[1], device=ids.device)[None] <= last[:, None]  # [N, T]
    token_logp = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
    if output_scores:
        scores = torch.stack(out.scores, dim=1).float().log_softmax(-1)  # [N, T, V]
        token_logp = scores.gather(-1, ids[..., None]).squeeze(-1).masked_fill(~completion_mask, 0.0)
    return Completions(ids=ids, completion_mask=completion_mask, is_truncated=~has_stop, token_logp=token_logp)


def shared_configs(model) -> dict:
    """A ``copy.deepcopy`` memo that shares the model's config objects (read-only) instead of copying them:
    ``model.network.configuration.SubConfig.__getattr__`` recurses when ``deepcopy`` probes a half-built copy."""
    from projects.llava_sam2.rl_train.model.network.configuration import Sa2VAConfig, SubConfig

    configs = [v for m in model.modules() for v in vars(m).values() if isinstance(v, (Sa2VAConfig, SubConfig))]
    configs += [v for c in list(configs) for v in vars(c).values() if isinstance(v, (Sa2VAConfig, SubConfig))]
    return {id(c): c for c in configs}


def hf_generate_with_scores(*args, **kwargs) -> Completions:
    return hf_generate_completions(*args, output_scores=True, **kwargs)


class NaiveStep:
    """Baseline (a): one dual-loop step done rollout by rollout (module docstring), timed on ``clock``.

    ``run(batch, K)`` returns ``{"seconds_measured", "seconds", "tokens", "rollouts_measured"}``; ``seconds`` and
    ``tokens`` are extrapolated to the N = B·G rollouts per loop of a real step (per-rollout phases × N / K).
    """

    def __init__(self, algo, optimizer, params, clock, texts):
        self.algo, self.model, self.processor = algo, algo.model, algo.processor
        self.optimizer, self.params, self.clock, self.texts = optimizer, params, clock, texts
        self.partner = copy.deepcopy(self.model, memo=shared_configs(self.model)).eval().requires_grad_(False)
        self.decoding = replace(algo.context.decoding, decode_backend=HF_GENERATE_SCORES)
        self.cfg = algo.config

    def encode(self, model, sample):
        """Both frozen encoders for one image, again for every rollout and model (no sharing)."""
        with self.clock("encode"):
            return encode_step(model, self.processor, [sample], use_region_cells=True, use_prompt_texts=True)

    def caption_rollout(self, sample) -> dict:
        """Loop 1 for one rollout: sample a caption (batch 1), score it under the reference, partner segments it."""
        model, proc, cfg, clock = self.model, self.processor, self.cfg, self.clock
        features = self.encode(model, sample)
        clock.loop = "mask_to_caption"
        with clock("rollout/mask_to_caption_policy_sampling"), eval_mode(model):
            ids, attention = proc.tokenize_prompts([proc.caption_prompt(features.n_tiles(0), features.region_cells[0])])
            ids, attention = ids.to(model.device), attention.to(model.device)
            embeds = prompt_embeds(model, features, model.project_vision(features.vit_tokens), ids, [0],
                                   [features.region_cells[0]])
            out = sample_text(model, embeds, attention, self.decoding, max_new_tokens=cfg.max_completion_length,
                              do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p)
        with self.algo.weights.reference(model), eval_mode(model), torch.no_grad():
            ref_embeds = prompt_embeds(model, features, model.project_vision(features.vit_tokens), ids, [0],
                                       [features.region_cells[0]])
            completion_logprobs(model.language_model, ref_embeds, attention, out.ids, out.completion_mask,
                                temperature=cfg.temperature)
        caption = self.texts(out, self.decoding)[0]
        partner_features = self.encode(self.partner, sample)
        with clock("rollout/mask_to_caption_partner_segment"):
            masks, stats = partner_segment(
                self.partner, proc, partner_features, self.partner.project_vision(partner_features.vit_tokens),
                [caption], [0], self.decoding, max_new_tokens=self.algo.context.seg_answer_max_tokens, chunk_size=None)
        return dict(sample=sample, ids=ids, attention=attention, out=out, pred_mask=masks[0], stats=stats)

    def mask_replay(self, features) -> MaskReplay:
        ctx, proc, device = self.algo.context, self.processor, self.model.device
        ids, attention = proc.tokenize_prompts([proc.segment_prompt(features.n_tiles(0), features.prompt_texts[0])])
        return MaskReplay(prompt_ids=ids.to(device), prompt_attention=attention.to(device),
                          answer_ids=ctx.seg_answer_ids.to(device)[None],
                          seg_index=torch.full((1,), ctx.seg_answer_index, device=device),
                          image_index=features.image_index, action=torch.empty(1))

    def mask_rollout(self, sample) -> dict:
        """Loop 2 for one rollout: sample a mask (batch 1), score it under the reference, partner describes it."""
        model, clock, policy = self.model, self.clock, self.algo.context.mask_policy
        features = self.encode(model, sample)
        clock.loop = "caption_to_mask"
        with clock("rollout/caption_to_mask_policy_sampling"), eval_mode(model), torch.no_grad():
            replay = self.mask_replay(features)
            head = seg_mask_head(model, features, model.project_vision(features.vit_tokens), replay, range(1), 1)
            action, _ = policy.sample(head)
            pred_mask = policy.pred_masks(head, action)[0].cpu()
        with self.algo.weights.reference(model), eval_mode(model), torch.no_grad():
            policy.log_prob(seg_mask_head(model, features, model.project_vision(features.vit_tokens), replay,
                                          range(1), 1), action)
        partner_features = self.encode(self.partner, sample)
        with clock("rollout/caption_to_mask_partner_describe"):
            partner_tiles = self.partner.project_vision(partner_features.vit_tokens)
            captions, stats = partner_describe(
                self.partner, self.processor, partner_features, partner_tiles, [pred_mask], [0], [sample.sample_id],
                self.decoding, max_new_tokens=self.cfg.max_completion_length, chunk_size=None)
        return dict(sample=sample, replay=replay, action=action, pred_mask=pred_mask, caption=captions[0],
                    stats=stats)

    def rewards(self, loop, rows: list[dict], pred_key: str) -> Tensor:
        """The loop's reward composer on the K rows; advantages = reward - mean (no groups among K rollouts)."""
        samples = [r["sample"] for r in rows]
        refs = [list(s.captions) or list(s.expressions) for s in samples]
        inputs = RewardInputs(sample_ids=[s.sample_id for s in samples], images=[s.image for s in samples],
                              gt_masks=[torch.as_tensor(s.gt_mask).bool() for s in samples], gt_captions=refs,
                              **{pred_key: [r["pred_mask" if pred_key == "pred_masks" else "caption"] for r in rows]})
        with self.clock("rewards"):
            total, _ = loop.composer.compute(inputs)  # [K]
        return (total - total.nanmean()).nan_to_num(0.0)

    def loss_backward(self, loop1: list[dict], loop2: list[dict], adv1: Tensor, adv2: Tensor) -> None:
        """A teacher-forced batch-1 forward and backward per rollout (encoders re-run for each)."""
        model, cfg, policy, K = self.model, self.cfg, self.algo.context.mask_policy, len(loop1)
        model.train()
        for row, advantage in zip(loop1, adv1.tolist()):
            features = self.encode(model, row["sample"])
            with self.clock("logprob_backward"):
                embeds = prompt_embeds(model, features, model.project_vision(features.vit_tokens), row["ids"], [0],
                                       [features.region_cells[0]])
                out = row["out"]
                logp = completion_logprobs(model.language_model, embeds, row["attention"], out.ids,
                                           out.completion_mask, temperature=cfg.temperature)  # [1, T]
                is_active = out.completion_mask.float()
                loss = -(advantage * (logp - logp.detach()).exp() * is_active).sum() / is_active.sum().clamp_min(1)
                (loss / K).backward()
        for row, advantage in zip(loop2, adv2.tolist()):
            features = self.encode(model, row["sample"])
            with self.clock("logprob_backward"):
                head = seg_mask_head(model, features, model.project_vision(features.vit_tokens), row["replay"],
                                     range(1), 1)
                logp = policy.log_prob(head, row["action"])  # [1, T]
                loss = -(advantage * (logp - logp.detach()).exp()).mean()
                (loss / K).backward()
        model.eval()

    @torch.no_grad()
    def ema_update(self) -> None:
        """MMEngine-style EMA: one lerp per tensor over every parameter of the copy, frozen ones included."""
        with self.clock("ema_partner"):
            weight = mmengine_momentum(self.cfg.ema_decay)
            for averaged, live in zip(self.partner.parameters(), self.model.parameters()):
                averaged.lerp_(live.detach(), weight)

    def run(self, batch, num_rollouts: int) -> dict:
        G, B = self.cfg.num_generations, len(batch)
        K = min(num_rollouts, B * G)
        self.clock.take()
        loop1 = [self.caption_rollout(batch[k // G]) for k in range(K)]  # rollout k = (sample k // G, draw k % G)
        loop2 = [self.mask_rollout(batch[k // G]) for k in range(K)]
        adv1 = self.rewards(self.algo.loops[0], loop1, "pred_masks")
        adv2 = self.rewards(self.algo.loops[1], loop2, "pred_captions")
        self.loss_backward(loop1, loop2, adv1, adv2)
        with self.clock("optimizer"):
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.ema_update()
        measured = self.clock.take()
        measured["rollout"] = sum(v for k, v in measured.items() if k.startswith("rollout/"))
        scale = B * G / K
        seconds = {k: v if k in PER_ITERATION_PHASES else v * scale for k, v in measured.items()}
        tokens = {"policy_caption_tokens": sum(float(r["out"].completion_mask.sum()) for r in loop1),
                  "partner_answer_tokens": sum(r["stats"]["partner/answer_tokens"] for r in loop1),
                  "partner_caption_tokens": sum(r["stats"]["partner/caption_tokens"] for r in loop2),
                  "partner_no_seg": sum(r["stats"]["partner/no_seg"] for r in loop1)}
        return {"rollouts_measured": K, "seconds_measured": measured, "seconds": seconds,
                "tokens": {k: v * scale for k, v in tokens.items()}}
