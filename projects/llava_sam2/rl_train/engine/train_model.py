"""Sa2VATrainModel: the MMEngine ``BaseModel`` that wraps a ``Sa2VAModel`` for SFT and GRPO training.

* Built from a released HF checkpoint (``pretrained_path``, e.g. ``./pretrained/Sa2VA-4B``) or a size preset plus
  a tokenizer (``preset='tiny'`` for tests and the demo). LoRA (r=128, alpha=256, dropout 0.05 by default) and the
  upstream SFT trainable set come from ``model/network/lora.py``.
* ``forward(data=..., mode='loss')`` is the upstream SFT loss (``model/sft/sft_loss.py``) of one ``sft_collate`` batch,
  so xtuner's ``TrainLoop`` can SFT-train it; ``forward(grpo_batch=mb, algorithm=algo)`` is
  ``algo.policy_loss(sa2va, mb)``, as ``GRPOLoop`` sends it; both together mix ``sft_loss_weight`` times the SFT loss
  into the GRPO step.
* ``state_dict()`` keeps only the trainable tensors (as upstream SFT checkpoints); ``export_pretrained`` writes the
  merged model in the upstream HF layout.
* ``build_algorithm(cfg)`` builds the GRPO algorithm with the live pieces it needs (model, processor and new
  ``WeightSets`` of policy / EMA partner / reference, which the algorithm owns); ``GRPOLoop`` keeps the algorithm
  (grpo/protocol.py: ``GRPOTrainModel``, ``GRPOAlgorithm``).
* ``rollout_context(optim_wrapper)`` / ``update_context(optim_wrapper)`` are the precision ``GRPOLoop`` runs the
  rollout and the update in (``rollout_precision`` / ``update_precision``): the loop only enters them.
"""
from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from mmengine.logging import print_log
from mmengine.model import BaseModel
from mmengine.optim import AmpOptimWrapper
from mmengine.registry import MODELS
from peft import PeftModel
from peft.helpers import disable_input_dtype_casting
from torch import nn

from ..grpo.config import GRPOConfig
from ..grpo.protocol import GRPOAlgorithm
from ..grpo.weights import WeightSets
from ..model.checkpoints.dtypes import as_torch_dtype
from ..model.checkpoints.hf_checkpoint import load_pretrained, save_pretrained
from ..model.decoding.text_decoding import TextDecoding
from ..model.network.lora import apply_lora, check_compute_dtype, configure_trainable, keep_trainable_in
from ..model.network.qwen_vl import Sa2VAQwenModel
from ..model.network.sa2va import Sa2VAModel
from ..model.sft.sft_loss import sft_loss
from ..model.text.processor import Sa2VAProcessor
from ..model.text.qwen_processor import Sa2VAQwenProcessor
from .builders import build_tokenizer, check_model_source, model_config
from .checkpointing import keep_trainable_state
from .registry import ALGORITHMS, build_component
from .stats import sum_across_ranks
from .upstream_sft import build_upstream_sft_model

# Upstream Sa2VA SFT LoRA (docs/sa2va_internals.md §6).
DEFAULT_LORA = dict(r=128, lora_alpha=256, lora_dropout=0.05)
# Logged when GRPO starts from a preset: why its losses and rewards are 0 (measured on tiny_grpo_cycle_cpu.py)
RANDOM_WEIGHTS_NOTE = (
    "Sa2VATrainModel: the model is a size preset with random weights (no checkpoint). Expect rewards, advantages, "
    "loss and grad_norm of 0 with the default rewards: the partner's answers contain no [SEG] (loop-1 IoU 0, "
    "'partner/no_seg'), its captions share no word with the references (loop-2 METEOR 0), so every group's rewards "
    "are equal and its advantages 0. Such a run checks that the stack runs; to see learning start from a trained "
    "checkpoint (model.pretrained_path) or run `sa2va-rl demo`.")


@contextmanager
def rollout_precision(model: nn.Module, optim_wrapper) -> Iterator[None]:
    """The precision of the no-grad passes of a GRPO step (encoders, rollout) of ``model`` trained by
    ``optim_wrapper``.

    Under an ``AmpOptimWrapper`` they run in the wrapper's own autocast, as ``train_step``'s forward does: the
    rollout's log-probs come from the loss pass's arithmetic, and the fp32 trained tensors (LoRA, ``mlp1``, mask
    decoder) of a bf16 model compute in bf16. peft's upcast of each adapter's input to the adapter's dtype is switched
    off under it (autocast would cast it back down). Any other wrapper: the model's own dtypes, no autocast.
    """
    is_amp = isinstance(optim_wrapper, AmpOptimWrapper)
    with optim_wrapper.optim_context(model) if is_amp else nullcontext(), \
            disable_input_dtype_casting(model, active=is_amp):
        yield


@contextmanager
def update_precision(model: nn.Module, optim_wrapper) -> Iterator[None]:
    """The precision around the ``train_step`` calls of a GRPO step: ``train_step`` autocasts the forward itself
    (and leaves the backward outside autocast, as torch recommends); under an ``AmpOptimWrapper`` peft's adapter-input
    upcast stays off for the whole update, because gradient checkpointing re-runs the forward during the backward."""
    with disable_input_dtype_casting(model, active=isinstance(optim_wrapper, AmpOptimWrapper)):
        yield


def _build_sa2va(pretrained_path, preset, upstream_sft, tokenizer, dtype):
    """(Sa2VAModel, tokenizer, train_mask_decoder) from exactly one source: an HF checkpoint, a preset, or an
    upstream XTuner SFT run (engine/upstream_sft.py)."""
    check_model_source(pretrained_path, preset, upstream_sft)
    if upstream_sft is not None:
        if tokenizer is not None:
            raise ValueError("Sa2VATrainModel: upstream_sft brings its tokenizer (the SFT config's, plus its special "
                             "tokens); remove tokenizer=")
        sa2va, tokenizer, flags, report, _ = build_upstream_sft_model(upstream_sft, torch_dtype=dtype)
        print_log(f"Sa2VATrainModel: upstream SFT run loaded: {report.summary()}", logger="current")
        if flags.sft_trained_embeddings:
            print_log("Sa2VATrainModel: the SFT run trained the embeddings and LM head; their trained values are "
                      "loaded, and RL trains them only with train_embeddings=True", logger="current")
        return sa2va, tokenizer, flags.train_mask_decoder
    tokenizer = build_tokenizer(tokenizer, pretrained_path, preset)
    if pretrained_path is not None:
        return load_pretrained(pretrained_path, torch_dtype=dtype).train(), tokenizer, True
    # random weights are drawn where the model will run: a 4B model initialised on the CPU costs minutes and 16 GB
    # of host memory per process (MMEngine has set this process's GPU before it builds the model)
    init_device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    with init_device or nullcontext():
        sa2va = Sa2VAModel(model_config(None, preset, vocab_size=len(tokenizer)))
    if dtype is not None:
        sa2va.to(dtype)
    return sa2va, tokenizer, True


@MODELS.register_module()
class Sa2VATrainModel(BaseModel):
    """Sa2VA for MMEngine training: SFT forward, GRPO forward, trainable-only checkpoints.

    Args:
        pretrained_path: HF Sa2VA checkpoint directory (``load_pretrained``); or None with ``preset``.
        preset: size preset name (``tiny`` / ``1b`` / ``4b`` / ``8b``) for a randomly initialised model.
        upstream_sft: start from an upstream XTuner SFT run: ``dict(sft_model=<the SFT config's model dict>,
            template=<its template>, pretrained_pth=<its iter_*.pth file or DeepSpeed dir>, lora_mode='keep' |
            'merge')`` (engine/upstream_sft.py); LoRA, freeze flags, special tokens and paths come from it. With
            'keep' the SFT adapter is trained on and ``lora`` is unused. A Qwen-VL family run (``arch_type='qwen'``)
            builds a ``Sa2VAQwenModel`` with its ``Sa2VAQwenProcessor`` (``processor_cfg``: its kwargs).
        tokenizer: tokenizer object, config dict or path; None reads it from ``pretrained_path`` (or the tiny one).
        lora: ``apply_lora`` kwargs (r, lora_alpha, lora_dropout, target_modules).
        train_embeddings: also train the LLM input embeddings and LM head (upstream SFT does; off for RL).
        gradient_checkpointing: LLM gradient checkpointing (memory for compute).
        torch_dtype: parameter dtype (``'bfloat16'`` ...); None keeps the checkpoint's (fp32 for presets).
        trainable_dtype: dtype of the trained tensors (LoRA, ``mlp1``, mask decoder, ``text_hidden_fcs``): fp32 master
            weights by default, whatever ``torch_dtype`` is, so small AdamW steps are not rounded away in bf16 and
            AMP's gradient unscale sees fp32 gradients; the arithmetic runs in the optimizer wrapper's autocast
            (``AmpOptimWrapper(dtype='bfloat16')``). Under DeepSpeed the engine casts the module to its bf16 and
            keeps the fp32 masters itself. None keeps them in ``torch_dtype``.
        processor_cfg: overrides of ``Sa2VAProcessor.from_config`` (e.g. ``empty_region='dilate_to_one_cell'``).
        sft_loss_cfg: keyword arguments of ``model.sft.sft_loss.sft_loss`` (e.g. ``num_points``).
        data_preprocessor: MMEngine data preprocessor config (default: move tensors to the model's device).
        weights_storage_device: where the EMA partner, reference snapshot and swap backup live; ``'cpu'`` keeps
            them in pinned host memory (no GPU memory, ~0.1 s per EMA update at 4B), None keeps them beside
            the model.
        weights_async_update: with host storage, run the EMA update's host lerp in a background thread, off the
            step's critical path (``WeightSets(async_update=...)``; None: on exactly for ``'cpu'`` storage).
    """

    def __init__(self, *, pretrained_path: str | None = None, preset: str | None = None,
                 upstream_sft: Mapping[str, Any] | None = None, tokenizer: Any = None,
                 lora: Mapping[str, Any] = DEFAULT_LORA, train_embeddings: bool = False,
                 gradient_checkpointing: bool = False, torch_dtype: str | torch.dtype | None = None,
                 trainable_dtype: str | torch.dtype | None = "float32",
                 processor_cfg: Mapping[str, Any] | None = None, sft_loss_cfg: Mapping[str, Any] | None = None,
                 data_preprocessor: dict | None = None, weights_storage_device: str | None = None,
                 weights_async_update: bool | None = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        sa2va, tokenizer, train_mask_decoder = _build_sa2va(pretrained_path, preset, upstream_sft, tokenizer,
                                                            as_torch_dtype(torch_dtype, "Sa2VATrainModel: torch_dtype"))
        sa2va.bind_tokenizer(tokenizer)
        is_qwen_vl = isinstance(sa2va, Sa2VAQwenModel)
        if gradient_checkpointing:
            llm = sa2va.hf_model if is_qwen_vl else sa2va.language_model
            llm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # lora_mode='keep' of an upstream SFT run: the LLM arrives with the SFT adapter, which RL continues (the
        # Qwen-VL family's adapter wraps its whole transformers model, as upstream's)
        self.is_lora_from_sft = isinstance(sa2va.model if is_qwen_vl else sa2va.language_model, PeftModel)
        if not self.is_lora_from_sft and is_qwen_vl:
            sa2va.apply_lora(**dict(lora))
        elif not self.is_lora_from_sft:
            sa2va.language_model = apply_lora(sa2va.language_model, **dict(lora))
        configure_trainable(sa2va, train_embeddings=train_embeddings, train_mask_decoder=train_mask_decoder)
        if trainable_dtype is not None:
            keep_trainable_in(sa2va, as_torch_dtype(trainable_dtype, "Sa2VATrainModel: trainable_dtype"))
        self.sa2va = sa2va
        self.is_random_init = preset is not None  # a preset has no checkpoint: every weight is random
        processor_cls = Sa2VAQwenProcessor if is_qwen_vl else Sa2VAProcessor
        self.processor = processor_cls.from_config(tokenizer, sa2va.config, **dict(processor_cfg or {}))
        self.sft_loss_cfg = dict(sft_loss_cfg or {})
        self.weights_storage_device = weights_storage_device
        self.weights_async_update = weights_async_update
        keep_trainable_state(self)

    def build_algorithm(self, cfg: Mapping[str, Any]) -> GRPOAlgorithm:
        """Build the GRPO algorithm (``train_cfg.algorithm``) with this model's live pieces; it owns new weight sets.

        ``cfg['config']`` (a ``GRPOConfig`` or its dict) also sizes the weight sets: the EMA partner decays at
        ``ema_decay`` and a reference snapshot is kept when ``beta > 0``. The algorithm gets the engine's
        ``sum_across_ranks`` for its global statistics (dapo's token count, the batch std).
        """
        if self.is_random_init:
            print_log(RANDOM_WEIGHTS_NOTE, logger="current", level=logging.WARNING)
        args = dict(cfg.items())
        config = args.get("config")
        config = config if isinstance(config, GRPOConfig) else GRPOConfig(**dict(config or {}))
        args["config"] = config
        # a LoRA adapter continued from SFT is not zero at the start, so "adapter off" is not the reference policy:
        # snapshot the LoRA tensors like the other trainables
        adapter = {"is_adapter": lambda name: False} if self.is_lora_from_sft else {}
        weights = WeightSets.from_model(self.sa2va, ema_decay=config.ema_decay, use_reference=config.beta > 0,
                                        storage_device=self.weights_storage_device,
                                        async_update=self.weights_async_update, **adapter)
        return build_component(ALGORITHMS, args, model=self.sa2va, processor=self.processor, weights=weights,
                               cross_rank_sum=sum_across_ranks)

    def rollout_context(self, optim_wrapper):
        """``GRPOTrainModel.rollout_context``: ``rollout_precision`` of this model."""
        return rollout_precision(self, optim_wrapper)

    def update_context(self, optim_wrapper):
        """``GRPOTrainModel.update_context``: ``update_precision`` of this model."""
        return update_precision(self, optim_wrapper)

    def forward(self, data: dict | None = None, data_samples=None, mode: str = "loss", grpo_batch=None,
                algorithm: GRPOAlgorithm | None = None, sft_loss_weight: float = 1.0) -> dict[str, torch.Tensor]:
        """Loss terms of an SFT batch (``data``, the ``sft_collate`` layout), a GRPO minibatch, or both.

        Returns ``grpo_loss`` plus the algorithm's ``<loop>/<stat>`` diagnostics for GRPO (``grpo_batch`` is one of
        ``algorithm.minibatches(...)``), and ``llm_loss``, ``loss_mask``, ``loss_dice`` (times ``sft_loss_weight``)
        for SFT.
        """
        if mode != "loss":
            raise NotImplementedError(f"Sa2VATrainModel.forward(mode={mode!r}): only training ('loss') is "
                                      "implemented; evaluate with `sa2va-rl evaluate` (evaluation/) or "
                                      "model/pipeline/inference.py `predict`.")
        if data is None and grpo_batch is None:
            raise ValueError("Sa2VATrainModel.forward: got neither an SFT batch (data=...) nor grpo_batch=...; "
                             "check the dataloader's collate_fn (sft_collate for SFT).")
        if (grpo_batch is None) != (algorithm is None):
            raise ValueError("Sa2VATrainModel.forward: grpo_batch= and algorithm= go together (the minibatch's loss is "
                             "algorithm.policy_loss(model, grpo_batch)); GRPOLoop passes both.")
        check_compute_dtype(self.sa2va, "Sa2VATrainModel.forward")
        losses: dict[str, torch.Tensor] = {}
        if grpo_batch is not None:
            out = dict(algorithm.policy_loss(self.sa2va, grpo_batch))
            losses["grpo_loss"] = out.pop("loss")
            losses.update(out)
        if data is not None:
            sft = sft_loss(self.sa2va, data, **self.sft_loss_cfg)
            losses.update({name: sft_loss_weight * value for name, value in sft.items()})
        return losses

    def parse_losses(self, losses: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Sum the loss terms: top-level keys containing 'loss' (``grpo_loss``, ``llm_loss``, ``loss_mask``, ...).

        Differs from MMEngine, which sums every key containing 'loss': namespaced keys (``mask_to_caption/pg_loss``)
        are diagnostics, logged but never added to the objective.
        """
        terms = [value for key, value in losses.items() if "/" not in key and "loss" in key]
        if not terms:
            raise ValueError(f"Sa2VATrainModel.parse_losses: no loss term among {sorted(losses)}.")
        loss = sum(terms)
        log_vars = OrderedDict(loss=loss.detach())
        log_vars.update((key, value.detach().float().mean()) for key, value in losses.items())
        return loss, log_vars

    def export_pretrained(self, path: str | os.PathLike, max_shard_size: int | str = "5GB") -> None:
        """Write the model (LoRA merged), its tokenizer and ``generation_config.json`` in the upstream HF layout.

        The generation config stops on the chat template's stop tokens (``<|im_end|>`` for Qwen2) and EOS, and pads
        with the processor's pad id, so ``generate`` on the exported model ends answers where training did."""
        from transformers import GenerationConfig

        save_pretrained(self.sa2va, path, max_shard_size=max_shard_size)
        tokenizer = self.processor.tokenizer
        tokenizer.save_pretrained(os.fspath(path))
        decoding = TextDecoding.from_processor(self.processor)
        GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=list(decoding.stop_token_ids),
                         pad_token_id=decoding.pad_token_id).save_pretrained(os.fspath(path))
