"""Tiny Sa2VA + CycleGRPO builders shared by test_grpo_cycle.py and test_grpo_trainer.py (tests only)."""
from __future__ import annotations

import functools

import torch

from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.grpo.trainer import CycleGRPO
from projects.llava_sam2.rl_train.grpo.weights import WeightSets
from projects.llava_sam2.rl_train.model.network.lora import apply_lora, configure_trainable
from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

# Fast settings: G = 4, captions of at most 6 tokens, partner RES answers of at most 4 tokens.
TINY_CONFIG = dict(num_generations=4, max_completion_length=6, beta=0.0, mask_pool=4)


def one_thread():
    """Generator body of an autouse fixture: run on one intra-op thread. The tiny model's ops are too small to gain
    from a second thread, and OpenMP spin-waiting makes 2 threads ~30x slower on a loaded 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@functools.lru_cache(maxsize=1)
def tokenizer():
    return load_tiny_tokenizer()


def build_tiny(seed: int = 0, lora_r: int = 4, preset: str = "tiny"):
    """Tiny Sa2VA with LoRA (r=4, dropout 0.05) and the SFT trainable set; lora_B drawn from N(0, 0.02) so that
    every LoRA tensor is on a gradient path (at B = 0 lora_A's gradient is exactly 0). ``preset``: ``tiny`` (Qwen2
    LLM) or ``tiny_qwen3``."""
    tok = tokenizer()
    torch.manual_seed(seed)
    model = Sa2VAModel(build_preset(preset, vocab_size=len(tok)))
    model.bind_tokenizer(tok)
    model.language_model = apply_lora(model.language_model, r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.05)
    configure_trainable(model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02)
    processor = Sa2VAProcessor.from_config(tok, model.config, empty_region="dilate_to_one_cell")
    return model, processor


def shapes_batch(n: int, seed: int = 0, image_size: int = 64):
    world = ShapesWorld("train", num_samples=n, seed=seed, image_size=image_size)
    return [world[i] for i in range(n)]


def make_algo(model, processor, rewards=None, *, seed: int = 0, **overrides):
    """CycleGRPO over fresh weight sets (reference kept when beta > 0)."""
    algo_keys = ("minibatch_size", "use_partner_captions", "seg_answer", "seg_answer_max_tokens")
    algo_kwargs = {k: overrides.pop(k) for k in algo_keys if k in overrides}
    algo_kwargs.setdefault("seg_answer_max_tokens", 4)
    config = {**TINY_CONFIG, **overrides}
    weights = WeightSets.from_model(model, ema_decay=0.9, use_reference=config["beta"] > 0)
    return CycleGRPO(model, processor, weights, rewards=rewards, config=config, seed=seed, **algo_kwargs), weights


class CaptionParityReward:
    """Deterministic loop-1 test reward on caption tokens: fraction of the caption's (re-encoded) token ids that are
    even; 0 for an empty caption."""

    name, weight = "parity", 1.0

    def __call__(self, inputs):
        values = []
        for caption in inputs.pred_captions:
            ids = tokenizer().encode(caption, add_special_tokens=False)
            values.append(sum(i % 2 == 0 for i in ids) / len(ids) if ids else 0.0)
        return values


def run_rollout(algo, batch):
    """encode → rollout → score → advantages; returns the ``AdvantagedStep`` (``.features``, ``.rollouts``)."""
    return algo.compute_advantages(algo.score(algo.rollout(algo.encode(batch))))


def step_loss(algo, model, advantaged):
    """Sum of policy_loss over the minibatches, backward per minibatch; returns the last output dict."""
    out = None
    for minibatch in algo.minibatches(advantaged):
        out = algo.policy_loss(model, minibatch)
        out["loss"].backward()
    return out


class RecordedLogp:
    """Wraps a loop's ``loss_fn``: keeps each call's (logp, the rollout's old_logp), then computes the loss."""

    def __init__(self, loss_fn):
        self.loss_fn, self.seen = loss_fn, []

    def __call__(self, logp, rollout, **kwargs):
        self.seen.append((logp.detach(), rollout.old_logp))
        return self.loss_fn(logp, rollout, **kwargs)
