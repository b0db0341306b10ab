"""LoRA on Sa2VA's language model and the one definition of the trainable tensors.

Upstream SFT (docs/sa2va_internals.md §6) trains LoRA adapters on the LLM (r=128, alpha=256, dropout 0.05, no
bias), ``mlp1``, the whole SAM2 ``sam_mask_decoder`` and ``text_hidden_fcs`` (plus the full
embeddings and LM head). RL reuses that set; the embeddings are opt-in because they are large and
the GRPO reference policy is "adapter disabled", which only covers LoRA (docs/stack.md §10).

Usage::

    model.language_model = apply_lora(model.language_model)
    configure_trainable(model)
    params = trainable_parameters(model)   # what the optimizer and the GRPO weight sets see
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.helpers import disable_input_dtype_casting
from torch import nn

from .transformers_seams import has_input_require_grads_hook

# LoRA target module names per LLM architecture (docs/sa2va_internals.md §8.3: what the released HF class
# re-wraps with; for Qwen2/Qwen3/Llama this equals xtuner's "every nn.Linear except the head"; Qwen3's q_norm and
# k_norm are RMSNorms, not Linear layers, so they are not targets).
# Differs from upstream SFT for InternLM2 only: xtuner there also wrapped the head ("output"),
# which SFT trained in full anyway.
LORA_TARGET_MODULES: dict[str, tuple[str, ...]] = {
    "Qwen2ForCausalLM": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "Qwen3ForCausalLM": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "LlamaForCausalLM": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "Phi3ForCausalLM": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
    "InternLM2ForCausalLM": ("wqkv", "wo", "w1", "w2", "w3"),
}


def _architecture(language_model: nn.Module) -> str:
    name = type(language_model).__name__
    if name in LORA_TARGET_MODULES:
        return name
    archs = getattr(getattr(language_model, "config", None), "architectures", None)
    return archs[0] if archs else name


def default_target_modules(language_model: nn.Module) -> tuple[str, ...]:
    """The LoRA targets for ``language_model``'s architecture (class name, else ``config.architectures[0]``)."""
    arch = _architecture(language_model)
    if arch not in LORA_TARGET_MODULES:
        raise ValueError(
            f"apply_lora: no default LoRA target modules for LLM architecture {arch!r}; known: "
            f"{sorted(LORA_TARGET_MODULES)}. Pass target_modules=[...] (the nn.Linear leaf names "
            "inside the decoder layers) or add the architecture to LORA_TARGET_MODULES."
        )
    return LORA_TARGET_MODULES[arch]


def apply_lora(
    language_model: nn.Module,
    r: int = 128,
    lora_alpha: int = 256,
    lora_dropout: float = 0.05,
    target_modules: list[str] | tuple[str, ...] | None = None,
) -> PeftModel:
    """Wrap ``language_model`` with peft LoRA (``task_type='CAUSAL_LM'``, ``bias='none'``).

    The adapter adds ``ΔW = (lora_alpha / r) · B A`` to each target Linear; B starts at zero, so
    the wrapped model's outputs equal the base model's until B is trained. Returns the PeftModel
    (assign it back to ``model.language_model``); peft freezes the base weights.
    """
    if isinstance(language_model, PeftModel):
        raise ValueError(
            "apply_lora: the language model is already peft-wrapped; apply LoRA once, or merge it "
            "first with language_model.merge_and_unload()."
        )
    if r < 1 or lora_alpha <= 0 or not 0 <= lora_dropout < 1:
        raise ValueError(
            f"apply_lora: need r >= 1, lora_alpha > 0, 0 <= lora_dropout < 1; got r={r}, "
            f"lora_alpha={lora_alpha}, lora_dropout={lora_dropout} (upstream SFT: 128, 256, 0.05)."
        )
    targets = list(target_modules) if target_modules is not None else list(default_target_modules(language_model))
    config = LoraConfig(
        r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, target_modules=targets,
        bias="none", task_type="CAUSAL_LM",
    )
    return get_peft_model(language_model, config)


def configure_trainable(model: nn.Module, *, train_embeddings: bool = False,
                        train_mask_decoder: bool = True) -> dict[str, nn.Parameter]:
    """Freeze ``model`` (a Sa2VAModel), then unfreeze the upstream SFT set.

    Trainable: LoRA tensors of ``language_model``, ``mlp1`` (InternVL family), ``grounding_encoder.sam2_model.
    sam_mask_decoder`` (unless ``train_mask_decoder=False``, upstream's ``frozen_sam2_decoder=True``),
    ``text_hidden_fcs``; with ``train_embeddings`` also the LLM input embeddings and LM head (as
    upstream SFT). With frozen embeddings and gradient checkpointing, the LLM's input embeddings are
    made to require grad so checkpointed blocks still backpropagate into LoRA (docs/sa2va_internals.md §8.3);
    enable checkpointing before calling this.

    Returns :func:`trainable_parameters` of the configured model.
    """
    language_model = model.language_model
    lora_names = [name for name, _ in language_model.named_parameters() if "lora_" in name]
    if not lora_names:
        raise ValueError(
            "configure_trainable: model.language_model has no LoRA parameters; wrap it first with "
            "model.language_model = apply_lora(model.language_model)."
        )
    model.requires_grad_(False)
    for name, param in language_model.named_parameters():
        if "lora_" in name:
            param.requires_grad_(True)
    if hasattr(model, "mlp1"):  # the InternVL family's projector (the Qwen-VL family's is in its frozen vision tower)
        model.mlp1.requires_grad_(True)
    model.grounding_encoder.sam2_model.sam_mask_decoder.requires_grad_(train_mask_decoder)
    model.text_hidden_fcs.requires_grad_(True)
    if train_embeddings:
        model.get_input_embeddings().requires_grad_(True)
        model.get_output_embeddings().requires_grad_(True)
    elif getattr(language_model, "is_gradient_checkpointing", False) and \
            not has_input_require_grads_hook(language_model):
        language_model.enable_input_require_grads()
    return trainable_parameters(model)


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """``{qualified name: parameter}`` for every tensor with ``requires_grad`` — the single list of
    what the optimizer updates and what the GRPO weight sets (policy / EMA partner) store."""
    return {name: param for name, param in model.named_parameters() if param.requires_grad}


def keep_trainable_in(model: nn.Module, dtype: torch.dtype) -> int:
    """Store every trainable tensor of ``model`` in ``dtype`` (the master weights of mixed precision); returns how
    many were cast.

    A bf16 model keeps its frozen weights in bf16 and its trained ones in fp32: AdamW's steps (lr x update, ~1e-5 of
    a weight) are below bf16's resolution (2^-8 relative) and would round away, and CUDA's AMP gradient unscale has
    no bf16 kernel. The arithmetic still runs in bf16 under the optimizer wrapper's autocast (``check_compute_dtype``
    says so where none is active). DeepSpeed casts the whole module to its own dtype and keeps fp32 masters itself.
    """
    cast = 0
    for param in trainable_parameters(model).values():
        if param.dtype != dtype:
            param.data = param.data.to(dtype)
            cast += 1
    return cast


def check_compute_dtype(model: nn.Module, where: str) -> None:
    """Raise a clear error when ``model`` mixes floating dtypes (frozen bf16, trained fp32: ``keep_trainable_in``)
    and no autocast is active on its device: the first matmul of a bf16 activation with an fp32 weight would fail
    with a bare dtype error."""
    dtypes = {param.dtype for param in model.parameters() if param.is_floating_point()}
    if len(dtypes) < 2:
        return
    device_type = next(model.parameters()).device.type
    if torch.is_autocast_enabled(device_type):
        return
    names = ", ".join(sorted(str(dtype).replace("torch.", "") for dtype in dtypes))
    raise RuntimeError(
        f"{where}: the model holds {names} weights (frozen weights in torch_dtype, trained tensors in fp32 master "
        "weights), which compute together only under an autocast. Train with optim_wrapper=dict(type=AmpOptimWrapper, "
        "dtype='bfloat16', ...) as the GPU configs do, or DeepSpeed (--deepspeed deepspeed_zero2), or set the model's "
        "trainable_dtype=None (trained tensors in torch_dtype; bf16 loses small updates).")


@contextmanager
def adapter_compute_dtype(model: nn.Module, dtype: torch.dtype | None):
    """Inside the block, LoRA adapters compute in ``dtype`` (bf16 / fp16) while their weights stay fp32: what
    ``GRPOLoop`` does under MMEngine's ``AmpOptimWrapper`` (its ``optim_context``), for callers without one (the
    step benchmark).

    peft keeps adapters in fp32 on a half-precision base (``autocast_adapter_dtype``) and casts each adapter's input
    up to fp32, so outside autocast every adapter GEMM of a bf16 model runs in fp32. Under ``torch.autocast(dtype)``
    they run in ``dtype``; peft's input upcast is switched off here because autocast would only cast the input back
    down (two extra kernels per adapter call). ``dtype`` None or fp32: nothing changes.
    """
    if dtype is None or dtype == torch.float32:
        yield
        return
    device_type = next(model.parameters()).device.type
    with torch.autocast(device_type=device_type, dtype=dtype), disable_input_dtype_casting(model):
        yield
