"""Length buckets (GRPOConfig.prompt_length_multiple / completion_length_multiple, model/text/lengths.py): every pass
of a bucketed step sees padded lengths from a few values, and the padding changes no log-prob, loss or gradient.

Why the values agree: left-padding columns are keys no real token attends to (the additive bias underflows their
softmax weight to exactly 0) and positions count only attended tokens (cumsum of the mask), so real tokens keep
their rotary angles; padded completion tokens are masked, their log-probs are 0 and enter no loss term. Only the
order of float sums over the longer key axis differs, hence a 1e-5 tolerance in fp32.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from grpo_tiny import CaptionParityReward, build_tiny, make_algo, one_thread, run_rollout, shapes_batch, tokenizer
from projects.llava_sam2.rl_train.grpo.config import GRPOConfig
from projects.llava_sam2.rl_train.model.decoding import text_decoding
from projects.llava_sam2.rl_train.model.decoding.generation import Completions, decoder_and_head
from projects.llava_sam2.rl_train.model.decoding.text_decoding import TextDecoding
from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.text.lengths import bucket_length, check_length_multiple
from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor

_one_thread = pytest.fixture(autouse=True)(one_thread)

PROMPT_MULTIPLE, COMPLETION_MULTIPLE, MAX_COMPLETION = 64, 4, 12


class WordCount:
    """Loop-2 test reward: words in the partner's caption."""

    name, weight = "words", 1.0

    def __call__(self, inputs):
        return [float(len(c.split())) for c in inputs.pred_captions]


def test_bucket_length_rounds_up_within_the_cap():
    assert [bucket_length(n, 64) for n in (1, 64, 65, 1850)] == [64, 64, 128, 1856]
    assert bucket_length(37, None) == bucket_length(37, 1) == 37
    assert [bucket_length(n, 32, cap=128) for n in (1, 33, 100, 128)] == [32, 64, 128, 128]
    assert bucket_length(7, 4, cap=6) == 7  # a cap below the length never truncates
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ValueError, match="expected None"):
            check_length_multiple("multiple", bad)
    with pytest.raises(ValueError, match="prompt_length_multiple=0"):
        GRPOConfig(prompt_length_multiple=0)
    with pytest.raises(ValueError, match="completion_length_multiple"):
        TextDecoding(None, (0,), (), 0, completion_length_multiple=0)


def test_tokenize_prompts_left_pads_to_a_multiple():
    processor = Sa2VAProcessor.from_config(tokenizer(), build_preset("tiny", vocab_size=len(tokenizer())))
    prompts = ["a red square", "a small blue circle on the left"]
    ids, attention = processor.tokenize_prompts(prompts)
    padded, padded_attention = processor.tokenize_prompts(prompts, pad_to_multiple_of=16)
    assert ids.shape[1] < 16 == padded.shape[1]
    assert torch.equal(padded[:, -ids.shape[1]:], ids) and torch.equal(padded_attention[:, -ids.shape[1]:], attention)
    assert not padded_attention[:, :-ids.shape[1]].any() and (padded[:, :-ids.shape[1]] == processor.pad_token_id).all()
    processor.prompt_length_multiple = 16  # what CycleGRPO sets from its config
    assert torch.equal(processor.tokenize_prompts(prompts)[0], padded)


def stopping_early(decode, seed: int = 0):
    """``decode`` (a decoder returning ``Completions``) with its sampled rows cut at seeded lengths 1..6, as stop
    tokens would cut them, and the batch shortened to its longest row. On random weights every sampled caption runs
    to the cap; this gives a step completions of several lengths, shorter than the cap."""
    generator = torch.Generator().manual_seed(seed)

    def decode_and_stop(*args, **kwargs):
        out = decode(*args, **kwargs)
        if not kwargs["do_sample"]:
            return out
        stops = torch.randint(1, 7, (out.ids.shape[0],), generator=generator)  # [n]
        T = int(stops.max())
        mask = out.completion_mask[:, :T] & (torch.arange(T)[None] < stops[:, None])  # [n, T]
        return Completions(out.ids[:, :T].masked_fill(~mask, kwargs["pad_token_id"]), mask,
                           torch.zeros_like(out.is_truncated), out.token_logp[:, :T].masked_fill(~mask, 0.0))

    return decode_and_stop


def bucketed_algo(monkeypatch):
    """Tiny CycleGRPO with both loops and length buckets, captions stopped early (:func:`stopping_early`)."""
    model, processor = build_tiny()
    monkeypatch.setattr(text_decoding, "decode_completions", stopping_early(text_decoding.decode_completions))
    rewards = {"mask_to_caption": [CaptionParityReward()], "caption_to_mask": [WordCount()]}
    algo, _ = make_algo(model, processor, rewards, beta=0.04, num_iterations=2, max_completion_length=MAX_COMPLETION,
                        prompt_length_multiple=PROMPT_MULTIPLE, completion_length_multiple=COMPLETION_MULTIPLE)
    return model, processor, algo


def record_layer0_lengths(model) -> tuple[list[int], object]:
    """Sequence lengths of every call of the LM's first decoder layer (a forward pre-hook), and the hook handle."""
    body, _ = decoder_and_head(model.language_model)
    lengths = []

    def hook(module, args, kwargs):
        lengths.append(int((args[0] if args else kwargs["hidden_states"]).shape[1]))

    return lengths, body.layers[0].register_forward_pre_hook(hook, with_kwargs=True)


def unpadded(rollout, completion_columns: int | None):
    """The rollout with the prompt columns that are padding in every row dropped (and its completions cut to
    ``completion_columns``): what the step would hold without buckets."""
    replay = rollout.replay
    keep = replay.prompt_attention.any(0)
    replay = dataclasses.replace(replay, prompt_ids=replay.prompt_ids[:, keep],
                                 prompt_attention=replay.prompt_attention[:, keep])
    if completion_columns is None:
        return dataclasses.replace(rollout, replay=replay)
    T = completion_columns
    replay = dataclasses.replace(replay, completion_ids=replay.completion_ids[:, :T])
    cut = {name: getattr(rollout, name)[:, :T] for name in ("old_logp", "ref_logp")}
    return dataclasses.replace(rollout, replay=replay, action_mask=rollout.action_mask[:, :T], **cut)


def loss_and_grads(algo, model, step) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    total = 0.0
    for minibatch in algo.minibatches(step):
        loss = algo.policy_loss(model, minibatch)["loss"]
        loss.backward()
        total += float(loss.detach())
    return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_bucketed_step_sees_bucket_lengths_and_scores_as_the_unbucketed_one(monkeypatch):
    model, processor, algo = bucketed_algo(monkeypatch)
    lengths, handle = record_layer0_lengths(model)
    step = run_rollout(algo, shapes_batch(3))
    captions, grounding = step.rollouts
    caption_lengths = captions.action_mask.sum(1)
    assert len(set(caption_lengths.tolist())) > 1  # the completions really differ in length
    T = captions.replay.completion_ids.shape[1]
    assert T == -(-int(caption_lengths.max()) // COMPLETION_MULTIPLE) * COMPLETION_MULTIPLE > caption_lengths.max()
    for replay in (captions.replay, grounding.replay):
        assert replay.prompt_ids.shape[1] % PROMPT_MULTIPLE == 0 and not replay.prompt_attention.all()
    loss, grads = loss_and_grads(algo, model, step)
    # layer 0 ran on: prompts and partner prompt parts (multiples of 64), the loop-2 RES prompt + its fixed answer
    # "Sure, [SEG]." (64k + A), decode steps (1), teacher-forced continuations (bucketed T - 1)
    answer = len(algo.context.seg_answer_ids)
    buckets = {1} | {c - 1 for c in range(COMPLETION_MULTIPLE, MAX_COMPLETION + 1, COMPLETION_MULTIPLE)} | \
              {MAX_COMPLETION - 1} | {k * PROMPT_MULTIPLE + a for k in range(1, 8) for a in (0, answer)}
    assert set(lengths) <= buckets, sorted(set(lengths) - buckets)

    # the loss pass (with grad) re-scores loop 1's captions exactly as the rollout did: old_logp bit for bit
    loop = algo.loops[0]
    rescored = loop.action_logp(model, step.features, model.project_vision(step.features.vit_tokens), captions,
                                range(3)).detach()
    assert torch.equal(rescored, captions.old_logp)

    # the same rollouts without buckets: equal log-probs, loss and gradients within float reordering
    plain = dataclasses.replace(step, rollouts=(unpadded(captions, int(caption_lengths.max())),
                                                unpadded(grounding, None)))
    assert plain.rollouts[0].replay.prompt_ids.shape[1] < captions.replay.prompt_ids.shape[1]
    with torch.no_grad():
        plain_logp = loop.action_logp(model, step.features, model.project_vision(step.features.vit_tokens),
                                      plain.rollouts[0], range(3))
    torch.testing.assert_close(rescored[:, :plain_logp.shape[1]], plain_logp, atol=1e-5, rtol=1e-5)
    assert not rescored[:, plain_logp.shape[1]:].any()  # padded completion columns score 0
    lengths.clear()
    plain_loss, plain_grads = loss_and_grads(algo, model, plain)
    handle.remove()
    assert set(lengths) - buckets  # the hook tells: without buckets the loss pass meets the batch's own lengths
    assert loss == pytest.approx(plain_loss, abs=1e-5)
    assert grads.keys() == plain_grads.keys() and len(grads) > 0
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], atol=1e-5, rtol=1e-5, msg=name)


def test_released_size_configs_bucket_and_cpu_configs_keep_exact_lengths():
    from pathlib import Path

    from mmengine.config import Config

    root = Path(__file__).resolve().parents[1] / "projects/llava_sam2/configs/rl"
    knobs = ("prompt_length_multiple", "completion_length_multiple")
    seen = {}
    for name in ("sa2va_4b_grpo_cycle.py", "gpu_smoke_4b.py", "tiny_grpo_cycle_cpu.py"):
        config = GRPOConfig(**Config.fromfile(str(root / name)).train_cfg["algorithm"]["config"])
        seen[name] = tuple(getattr(config, knob) for knob in knobs)
    assert seen == {"sa2va_4b_grpo_cycle.py": (64, 32), "gpu_smoke_4b.py": (64, 32),
                    "tiny_grpo_cycle_cpu.py": (None, None)}


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_qwen_vl_prompts_score_the_same_with_buckets(family):
    """The Qwen-VL family's M-RoPE positions come from ``get_rope_index`` over the attention mask, so extra left
    padding moves no real token's position: bucketed prompts (64) and completions (8) score as the exact ones."""
    pytest.importorskip("transformers", minversion="4.57")  # Qwen3VLForConditionalGeneration
    from PIL import Image
    from qwen_vl_fixtures import tiny_qwen_model, tiny_qwen_tokenizer

    from projects.llava_sam2.rl_train.model.decoding.grouped_scoring import grouped_completion_logprobs
    from projects.llava_sam2.rl_train.model.pipeline.qwen_vl_prompts import qwen_vl_prompt_inputs
    from projects.llava_sam2.rl_train.model.pipeline.shared import encode_images
    from projects.llava_sam2.rl_train.model.text.qwen_processor import Sa2VAQwenProcessor

    tok = tiny_qwen_tokenizer()
    model = tiny_qwen_model(family)
    model.bind_tokenizer(tok)
    processor = Sa2VAQwenProcessor.from_config(tok, model.config, min_pixels=4 * 28 * 28, max_pixels=16 * 28 * 28)
    rng = np.random.default_rng(0)
    images = [Image.fromarray((rng.random(shape) * 255).astype(np.uint8)) for shape in ((70, 100, 3), (60, 60, 3))]
    encoded = encode_images(model, processor, images, ["image 0", "image 1"])
    prompts = [processor.segment_prompt(encoded.n_tiles(0), "the circle"),
               processor.segment_prompt(encoded.n_tiles(1), "the small blue square on the left")]
    G, generator = 2, torch.Generator().manual_seed(0)
    completion_ids = torch.randint(20, 200, (2 * G, 5), generator=generator)  # [N, T]
    completion_mask = torch.arange(5)[None] < torch.tensor([5, 3, 4, 1])[:, None]  # [N, T]
    scores = []
    for multiple, T in ((None, 5), (64, 8)):
        ids, attention = processor.tokenize_prompts(prompts, pad_to_multiple_of=multiple)
        padded = torch.nn.functional.pad(completion_ids, (0, T - 5))
        padded_mask = torch.nn.functional.pad(completion_mask, (0, T - 5))
        with torch.no_grad():
            inputs = qwen_vl_prompt_inputs(model, encoded, [0, 1], ids, attention)
            scores.append(grouped_completion_logprobs(
                model.hf_model, inputs.embeds, attention.bool(), padded, padded_mask, num_generations=G,
                prompt_positions=inputs.positions, prefix_additions=inputs.layer_additions))
    assert scores[1].shape == (4, 8) and not scores[1][:, 5:].any()
    torch.testing.assert_close(scores[1][:, :5], scores[0], atol=1e-5, rtol=1e-5)


def test_qwen_vl_loop_1_step_buckets_and_scores_as_the_unbucketed_one(monkeypatch):
    """Loop 1 on the Qwen-VL family (captions sampled on the drawn region through the family's sampler): its prompts
    and captions are bucketed too, old_logp equals the loss pass bit for bit, and the loss and gradients equal those
    of the same rollout without the padding within 1e-5."""
    pytest.importorskip("transformers", minversion="4.57")
    from qwen_vl_fixtures import tiny_qwen_tokenizer
    from test_qwen_vl_grpo import LOOP1_ONLY, _lora_replica

    from projects.llava_sam2.rl_train.model.pipeline import qwen_vl_prompts

    model, processor = _lora_replica("qwen2_5_vl", tiny_qwen_tokenizer())
    monkeypatch.setattr(qwen_vl_prompts, "decode_completions", stopping_early(qwen_vl_prompts.decode_completions))
    algo, _ = make_algo(model, processor, {"mask_to_caption": [CaptionParityReward()]}, beta=0.04, num_iterations=2,
                        max_completion_length=MAX_COMPLETION, prompt_length_multiple=PROMPT_MULTIPLE,
                        completion_length_multiple=COMPLETION_MULTIPLE, **LOOP1_ONLY)
    step = run_rollout(algo, shapes_batch(2))
    captions, = step.rollouts
    caption_lengths = captions.action_mask.sum(1)
    assert captions.replay.prompt_ids.shape[1] % PROMPT_MULTIPLE == 0
    assert captions.replay.completion_ids.shape[1] % COMPLETION_MULTIPLE == 0
    assert captions.replay.completion_ids.shape[1] > caption_lengths.max()
    model.train()
    loop = algo.loops[0]
    rescored = loop.action_logp(model, step.features, None, captions, range(2)).detach()
    assert torch.equal(rescored, captions.old_logp)
    loss, grads = loss_and_grads(algo, model, step)
    plain = dataclasses.replace(step, rollouts=(unpadded(captions, int(caption_lengths.max())),))
    plain_loss, plain_grads = loss_and_grads(algo, model, plain)
    assert loss == pytest.approx(plain_loss, abs=1e-5) and grads.keys() == plain_grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], atol=1e-5, rtol=1e-5, msg=name)
