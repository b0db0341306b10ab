"""Policy, EMA partner and reference as three values of the same trainable tensors on one backbone.

The frozen backbone (vision encoder, LLM base weights, SAM2 image encoder) is shared. Only the trainable
tensors (LoRA, ``mlp1``, SAM2 mask decoder, ``text_hidden_fcs``) have three values:

* policy:    the live parameters the optimizer updates;
* partner:   an fp32 EMA shadow of every trainable tensor, partner <- lerp(partner, policy, 1 - ema_decay);
* reference: the starting (SFT) policy: LoRA switched off through peft's ``disable_adapter()`` (a fresh LoRA
  has B = 0, so "off" is the start) plus a frozen snapshot of the non-LoRA trainables.

``with sets.partner(model):`` / ``with sets.reference(model):`` copy those values into the live parameters
after backing the policy up into a preallocated buffer, and restore it bit-exactly in ``finally``. Tensors are
paired by name against the model's trainable set at every swap. Swap only where no autograd graph holds the
trainable tensors (rollouts, reference/partner scoring): the in-place copy bumps their version counters, so a
backward through a graph recorded before the swap would raise.

Not supported: DeepSpeed ZeRO-3 partitioned parameters (raise NotImplementedError; gathering them is future
work). ZeRO-1/2 keep full parameters on every rank and work as is.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn


def mmengine_momentum(ema_decay: float) -> float:
    """MMEngine's EMA ``momentum`` for our ``ema_decay`` (the only place the two conventions meet): 1 - decay."""
    return 1.0 - ema_decay


def is_lora_tensor(name: str) -> bool:
    """True for peft LoRA tensors (``...q_proj.lora_A.default.weight``, ``lora_embedding_B``, ...)."""
    return any(part.startswith("lora_") for part in name.split("."))


@dataclass(frozen=True)
class WeightSetMemory:
    """Bytes held besides the policy: fp32 partner shadow, reference snapshot, swap backup buffer."""

    partner_bytes: int
    reference_bytes: int
    swap_buffer_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.partner_bytes + self.reference_bytes + self.swap_buffer_bytes

    def fraction_of(self, model: nn.Module) -> float:
        """``total_bytes`` relative to the bytes of all of ``model``'s parameters."""
        return self.total_bytes / sum(p.numel() * p.element_size() for p in model.parameters())


def _nbytes(tensors: list[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class WeightSets:
    """EMA partner and reference values of a model's trainable tensors, swapped in by context managers.

    Args:
        trainable: name -> parameter, the model's trainable set (``WeightSets.from_model`` takes every
            ``requires_grad`` parameter); names are those of ``model.named_parameters()``.
        ema_decay: partner = ema_decay * partner + (1 - ema_decay) * policy per ``update_partner``.
        use_reference: keep a reference snapshot (False when ``beta == 0`` saves its memory).
        is_adapter: names covered by peft's ``disable_adapter()`` in the reference: no snapshot for them.
    """

    def __init__(self, trainable: Mapping[str, nn.Parameter], *, ema_decay: float = 0.999,
                 use_reference: bool = True, is_adapter: Callable[[str], bool] = is_lora_tensor):
        if not trainable:
            raise ValueError("WeightSets: the trainable set is empty; unfreeze the LoRA / mlp1 / decoder tensors "
                             "before building the weight sets.")
        if not 0.0 < ema_decay < 1.0:
            raise ValueError(f"WeightSets: ema_decay={ema_decay} must lie in (0, 1), e.g. 0.999.")
        partitioned = [n for n, p in trainable.items() if hasattr(p, "ds_status")]
        if partitioned:
            raise NotImplementedError(f"WeightSets: {partitioned[0]} is a DeepSpeed ZeRO-3 partitioned parameter; "
                                      "ZeRO-3 is not supported yet, use ZeRO-2 (deepspeed_zero2).")
        self.ema_decay = ema_decay
        self.names = sorted(trainable)
        self.adapter_names = [n for n in self.names if is_adapter(n)]
        self.reference_names = [n for n in self.names if not is_adapter(n)]
        self.num_updates = 0
        self._active: str | None = None
        with torch.no_grad():
            self._partner = {n: p.detach().to(torch.float32, copy=True) for n, p in trainable.items()}
            self._reference = ({n: trainable[n].detach().clone() for n in self.reference_names}
                               if use_reference else None)
            self._backup = {n: torch.empty_like(p) for n, p in trainable.items()}

    @classmethod
    def from_model(cls, model: nn.Module, **kwargs) -> "WeightSets":
        """Weight sets over every ``requires_grad`` parameter of ``model`` (LoRA, mlp1, decoder, ...)."""
        return cls({n: p for n, p in model.named_parameters() if p.requires_grad}, **kwargs)

    # ---- partner (EMA) -------------------------------------------------------------------------------------

    @torch.no_grad()
    def update_partner(self, model: nn.Module) -> None:
        """partner <- partner + (1 - ema_decay) * (policy - partner), one fused multi-tensor lerp in fp32."""
        if self._active is not None:
            raise RuntimeError(f"WeightSets.update_partner: called inside the {self._active} swap, where the live "
                               "tensors are not the policy; update after the `with` block.")
        live = self._live(model, self.names)
        shadow = [self._partner[n] for n in self.names]
        policy = [p.detach() if p.dtype == torch.float32 else p.detach().float() for p in live]
        torch._foreach_lerp_(shadow, policy, mmengine_momentum(self.ema_decay))
        self.num_updates += 1

    @contextmanager
    def partner(self, model: nn.Module) -> Iterator[None]:
        """Run the body with the EMA partner's values in every trainable tensor."""
        with self._swapped(model, self.names, self._partner, "partner"):
            yield

    # ---- reference -----------------------------------------------------------------------------------------

    @contextmanager
    def reference(self, model: nn.Module) -> Iterator[None]:
        """Run the body as the reference policy: LoRA disabled, non-LoRA trainables at their snapshot."""
        if self._reference is None:
            raise RuntimeError("WeightSets.reference: built with use_reference=False (beta == 0); build it with "
                               "use_reference=True to score against the reference policy.")
        adapter_owners = self._adapter_owners(model)
        with ExitStack() as stack:
            stack.enter_context(self._swapped(model, self.reference_names, self._reference, "reference"))
            for peft_model in adapter_owners:
                stack.enter_context(peft_model.disable_adapter())
            yield

    def _adapter_owners(self, model: nn.Module) -> list:
        """The ``peft.PeftModel``s inside ``model`` whose ``disable_adapter()`` switches the LoRA tensors off."""
        if not self.adapter_names:
            return []
        from peft import PeftModel  # only models with LoRA tensors need peft (keeps `import grpo` light)

        owners = [m for m in model.modules() if isinstance(m, PeftModel)]
        if not owners:
            raise TypeError(f"WeightSets.reference: trainable tensor {self.adapter_names[0]!r} is a LoRA tensor but "
                            f"{type(model).__name__} holds no peft.PeftModel whose adapter can be disabled; wrap the "
                            "LLM with peft.get_peft_model or pass is_adapter=lambda name: False to snapshot it.")
        return owners

    # ---- swapping ------------------------------------------------------------------------------------------

    def _live(self, model: nn.Module, names: list[str]) -> list[nn.Parameter]:
        """The model's parameters for ``names``, after checking its trainable set is exactly ours."""
        params = dict(model.named_parameters())
        trainable = {n for n, p in params.items() if p.requires_grad}
        if trainable != set(self.names):
            missing, extra = sorted(set(self.names) - trainable), sorted(trainable - set(self.names))
            raise ValueError(f"WeightSets: the model's trainable tensors differ from the weight sets' "
                             f"(missing {missing[:3]}, unexpected {extra[:3]}); pass the unwrapped model whose "
                             "trainable set built these weight sets, without changing requires_grad since.")
        return [params[n] for n in names]

    @contextmanager
    def _swapped(self, model: nn.Module, names: list[str], values: dict[str, Tensor], what: str) -> Iterator[None]:
        if self._active is not None:
            raise RuntimeError(f"WeightSets: cannot enter the {what} swap inside the {self._active} swap; "
                               "leave the first `with` block before entering the second.")
        live = self._live(model, names)
        backup = [self._backup[n] for n in names]
        with torch.no_grad():
            torch._foreach_copy_(backup, live)
            self._active = what
        try:
            with torch.no_grad():
                torch._foreach_copy_(live, [values[n] for n in names])  # casts the fp32 partner to the param dtype
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(live, backup)
            self._active = None

    # ---- checkpoints and accounting ------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Partner shadow, reference snapshot and counters. The reference is saved too: after a resume the live
        weights are the trained policy, so it cannot be re-taken from the model."""
        return {"ema_decay": self.ema_decay, "num_updates": self.num_updates,
                "partner": dict(self._partner), "reference": None if self._reference is None else dict(self._reference)}

    @torch.no_grad()
    def load_state_dict(self, state: Mapping) -> None:
        """Copy a ``state_dict()`` back in after checking names, shapes and that the reference setting matches.

        ``ema_decay`` stays the constructor's (the config's), so a changed decay on resume takes effect."""
        if (state["reference"] is None) != (self._reference is None):
            raise ValueError("WeightSets.load_state_dict: the checkpoint and these weight sets disagree on "
                             "use_reference; build the weight sets with the setting used when saving.")
        for key, target in (("partner", self._partner), ("reference", self._reference or {})):
            saved = state[key] or {}
            if set(saved) != set(target):
                raise ValueError(f"WeightSets.load_state_dict: {key} names differ from the model's trainable set "
                                 f"(missing {sorted(set(target) - set(saved))[:3]}, unexpected "
                                 f"{sorted(set(saved) - set(target))[:3]}).")
            for name, value in saved.items():
                if value.shape != target[name].shape:
                    raise ValueError(f"WeightSets.load_state_dict: {key}[{name!r}] has shape {tuple(value.shape)}, "
                                     f"expected {tuple(target[name].shape)}.")
                target[name].copy_(value)
        self.num_updates = int(state["num_updates"])

    def memory(self) -> WeightSetMemory:
        """Bytes held by the partner shadow, the reference snapshot and the swap buffer."""
        return WeightSetMemory(
            partner_bytes=_nbytes(list(self._partner.values())),
            reference_bytes=_nbytes(list((self._reference or {}).values())),
            swap_buffer_bytes=_nbytes(list(self._backup.values())),
        )
