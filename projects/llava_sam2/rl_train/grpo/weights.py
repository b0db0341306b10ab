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

Storage (``storage_device``): by default each value lives beside its parameter (on the GPU). With
``storage_device='cpu'`` the fp32 partner shadow, a copy of it in each parameter's dtype, the reference snapshot
and the swap backup live in pinned host memory, so partner + reference cost no GPU memory (goal ≤ 5 % of the model; LoRA
r=128 on a 3B LLM alone has ~240 M trainable values, whose fp32 shadow is already 12 % of the bf16 model). A swap
is then two asynchronous same-dtype copies per direction (backup device→host, values host→device; stream-ordered,
so the restore is bit-exact), and ``update_partner`` copies the policy to the host (reusing the backup buffer), waits
for it, and lerps on the CPU with fused multi-tensor ops (``model/network/torch_seams.py``).

Background update (``async_update``, on by default with host storage): ``update_partner`` returns once the policy
sits in the host staging buffer, and the host lerp + dtype copy run in one worker thread (torch's CPU kernels release
the GIL), off the step's critical path; the partner is next needed in the next step's rollout. The staged copy is
complete before ``update_partner`` returns, so the next optimizer step cannot change what the lerp reads. Everything
that reads or rewrites the partner, the reference or the staging buffer (``partner``, ``reference``,
``update_partner``, ``state_dict``, ``load_state_dict``) first waits for the pending update (``wait_for_update``);
the values are bit for bit those of the synchronous path (the same kernels on the same tensors). An exception in the
worker is raised at that wait, and again at every later use: a half-applied update leaves the shadow unusable, until
``load_state_dict`` replaces it (resume from the last checkpoint).

Not supported: DeepSpeed ZeRO-3 partitioned parameters (raise NotImplementedError; gathering them is future
work). ZeRO-1/2 keep full parameters on every rank and work as is.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..model.network.torch_seams import foreach_copy_, foreach_lerp_


def mmengine_momentum(ema_decay: float) -> float:
    """MMEngine's EMA ``momentum`` for our ``ema_decay`` (the only place the two conventions meet): 1 - decay."""
    return 1.0 - ema_decay


def is_lora_tensor(name: str) -> bool:
    """True for peft LoRA tensors (``...q_proj.lora_A.default.weight``, ``lora_embedding_B``, ...)."""
    return any(part.startswith("lora_") for part in name.split("."))


STORAGE_DEVICES = (None, "cpu")  # None: beside each parameter; "cpu": (pinned) host memory

# Tensors per fused host-side update call: bounds the fp32 temporaries of the bf16 -> fp32 policy cast.
_HOST_GROUP_NUMEL = 1 << 26


@dataclass(frozen=True)
class WeightSetMemory:
    """Bytes held besides the policy: fp32 partner shadow (+ its parameter-dtype copy on the host), reference
    snapshot, swap backup buffer, and where they live (``storage_device``: None = the parameters' device)."""

    partner_bytes: int
    reference_bytes: int
    swap_buffer_bytes: int
    partner_cast_bytes: int = 0
    storage_device: str | None = None

    @property
    def total_bytes(self) -> int:
        return self.partner_bytes + self.reference_bytes + self.swap_buffer_bytes + self.partner_cast_bytes

    @property
    def device_bytes(self) -> int:
        """Bytes on the parameters' device: all of them, or 0 when stored on the host."""
        return self.total_bytes if self.storage_device is None else 0

    def fraction_of(self, model: nn.Module) -> float:
        """``total_bytes`` relative to the bytes of all of ``model``'s parameters."""
        return self.total_bytes / _nbytes(list(model.parameters()))

    def device_fraction_of(self, model: nn.Module) -> float:
        """``device_bytes`` relative to the model's parameter bytes (the goal: <= 5 %)."""
        return self.device_bytes / _nbytes(list(model.parameters()))


def _nbytes(tensors: list[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _groups(names: list[str], numel: Callable[[str], int], limit: int = _HOST_GROUP_NUMEL) -> Iterator[list[str]]:
    """Consecutive runs of ``names`` holding at most ``limit`` elements each (a larger tensor is a run alone)."""
    run, size = [], 0
    for name in names:
        if run and size + numel(name) > limit:
            yield run
            run, size = [], 0
        run.append(name)
        size += numel(name)
    if run:
        yield run


def _copy_all(dst: list[Tensor], src: list[Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for all i, asynchronous where a side is pinned host memory: one fused
    ``foreach_copy_`` when both lists live on one device, else one copy per tensor (host<->device DMA)."""
    devices = {t.device for t in dst} | {t.device for t in src}
    if len(devices) == 1:
        foreach_copy_(dst, src, non_blocking=True)
        return
    for target, value in zip(dst, src):
        target.copy_(value, non_blocking=True)


def _synchronize(tensors: list[Tensor]) -> None:
    """Wait for the current stream of every CUDA device among ``tensors`` (host reads after async copies)."""
    for device in {t.device for t in tensors if t.is_cuda}:
        torch.cuda.current_stream(device).synchronize()


class WeightSets:
    """EMA partner and reference values of a model's trainable tensors, swapped in by context managers.

    Args:
        trainable: name -> parameter, the model's trainable set (``WeightSets.from_model`` takes every
            ``requires_grad`` parameter); names are those of ``model.named_parameters()``.
        ema_decay: partner = ema_decay * partner + (1 - ema_decay) * policy per ``update_partner``.
        use_reference: keep a reference snapshot (False when ``beta == 0`` saves its memory).
        is_adapter: names covered by peft's ``disable_adapter()`` in the reference: no snapshot for them.
        storage_device: None keeps every value beside its parameter; ``'cpu'`` keeps them in host memory (pinned when
            CUDA is available) and swaps / updates through asynchronous copies (module docstring).
        async_update: with ``storage_device='cpu'``, run the host lerp of ``update_partner`` in a background thread
            (module docstring); None turns it on exactly for host storage. On-device storage already runs its update
            asynchronously on the accelerator's stream, so True is refused there.
    """

    def __init__(self, trainable: Mapping[str, nn.Parameter], *, ema_decay: float = 0.999,
                 use_reference: bool = True, is_adapter: Callable[[str], bool] = is_lora_tensor,
                 storage_device: str | None = None, async_update: bool | None = None):
        if not trainable:
            raise ValueError("WeightSets: the trainable set is empty; unfreeze the LoRA / mlp1 / decoder tensors "
                             "before building the weight sets.")
        if not 0.0 < ema_decay < 1.0:
            raise ValueError(f"WeightSets: ema_decay={ema_decay} must lie in (0, 1), e.g. 0.999.")
        partitioned = [n for n, p in trainable.items() if hasattr(p, "ds_status")]
        if partitioned:
            raise NotImplementedError(f"WeightSets: {partitioned[0]} is a DeepSpeed ZeRO-3 partitioned parameter; "
                                      "ZeRO-3 is not supported yet, use ZeRO-2 (deepspeed_zero2).")
        if storage_device not in STORAGE_DEVICES:
            raise ValueError(f"WeightSets: storage_device={storage_device!r} is not one of {STORAGE_DEVICES}; use None "
                             "(values beside the parameters) or 'cpu' (pinned host memory, no accelerator memory).")
        if async_update and storage_device is None:
            raise ValueError("WeightSets: async_update=True needs storage_device='cpu' (a host-side update to move off "
                             "the critical path); on-device storage already updates on the accelerator's stream.")
        self.ema_decay = ema_decay
        self.storage_device = storage_device
        self.async_update = storage_device == "cpu" if async_update is None else bool(async_update)
        self._executor: ThreadPoolExecutor | None = None  # one worker, created at the first background update
        self._pending: Future | None = None
        self._failure: BaseException | None = None
        self.names = sorted(trainable)
        self.adapter_names = [n for n in self.names if is_adapter(n)]
        self.reference_names = [n for n in self.names if not is_adapter(n)]
        self.num_updates = 0
        self._active: str | None = None
        with torch.no_grad():
            self._partner = {n: self._store(p, torch.float32) for n, p in trainable.items()}
            self._reference = ({n: self._store(trainable[n]) for n in self.reference_names}
                               if use_reference else None)
            self._backup = {n: self._store(p, copy=False) for n, p in trainable.items()}
            # host storage: the partner in each parameter's dtype, refreshed by update_partner, so that swapping it in
            # is one same-dtype asynchronous copy (a cross-dtype host->device copy would convert on the host first)
            self._partner_cast = ({n: self._store(p) for n, p in trainable.items()}
                                  if storage_device == "cpu" else None)

    def _store(self, param: Tensor, dtype: torch.dtype | None = None, *, copy: bool = True) -> Tensor:
        """A buffer shaped like ``param`` (in ``dtype``, default the parameter's) on the storage, holding its values
        when ``copy``; host buffers are pinned when CUDA is available (asynchronous copies)."""
        dtype = dtype or param.dtype
        if self.storage_device is None:
            value = torch.empty_like(param, dtype=dtype)
        else:
            value = torch.empty(param.shape, dtype=dtype, device="cpu", pin_memory=torch.cuda.is_available())
        return value.copy_(param.detach()) if copy else value

    @classmethod
    def from_model(cls, model: nn.Module, **kwargs) -> "WeightSets":
        """Weight sets over every ``requires_grad`` parameter of ``model`` (LoRA, mlp1, decoder, ...)."""
        return cls({n: p for n, p in model.named_parameters() if p.requires_grad}, **kwargs)

    # ---- partner (EMA) -------------------------------------------------------------------------------------

    @torch.no_grad()
    def update_partner(self, model: nn.Module) -> None:
        """partner <- partner + (1 - ema_decay) * (policy - partner), one fused multi-tensor lerp in fp32.

        With ``async_update`` the call returns once the policy is staged on the host; the lerp finishes in the
        background (module docstring)."""
        if self._active is not None:
            raise RuntimeError(f"WeightSets.update_partner: called inside the {self._active} swap, where the live "
                               "tensors are not the policy; update after the `with` block.")
        self.wait_for_update()  # the staging buffer and the shadow belong to the previous update until it is done
        live = self._live(model, self.names)
        weight = mmengine_momentum(self.ema_decay)
        if self.storage_device is None:
            shadow = [self._partner[n] for n in self.names]
            policy = [p.detach() if p.dtype == torch.float32 else p.detach().float() for p in live]
            foreach_lerp_(shadow, policy, weight)
        else:
            staging = [self._backup[n] for n in self.names]  # the swap backup is free outside a swap
            _copy_all(staging, [p.detach() for p in live])  # device -> host
            _synchronize(live)  # the host reads the staged policy, and may now rewrite the cast buffers
            if self.async_update:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ema_partner")
                self._pending = self._executor.submit(self._lerp_staged_on_host, weight)
            else:
                self._lerp_staged_on_host(weight)
        self.num_updates += 1

    @torch.no_grad()  # grad mode is per thread: the worker sets its own
    def _lerp_staged_on_host(self, weight: float) -> None:
        """The host part of ``update_partner``: lerp the fp32 shadow towards the staged policy, refresh its cast."""
        for names in _groups(self.names, lambda n: self._partner[n].numel()):
            shadow = [self._partner[n] for n in names]
            foreach_lerp_(shadow, [self._backup[n].float() for n in names], weight)
            foreach_copy_([self._partner_cast[n] for n in names], shadow)  # fp32 -> parameter dtype

    @property
    def update_pending(self) -> bool:
        """True while a background partner update has been launched and not yet waited for."""
        return self._pending is not None

    def wait_for_update(self) -> None:
        """Block until the background partner update (if any) is done; raise if it, or an earlier one, failed."""
        if self._pending is not None:
            error = self._pending.exception()  # blocks; an interrupt of this thread leaves the update pending
            self._pending = None
            if error is not None:
                self._failure = error  # kept: re-raised at every later use until load_state_dict
        if self._failure is not None:
            raise RuntimeError(
                f"WeightSets: a background EMA partner update failed ({type(self._failure).__name__}: "
                f"{self._failure}); the partner shadow may be partly updated, so the weight sets refuse to be used or "
                "saved. Fix the cause and resume from the newest checkpoint (or pass async_update=False to see the "
                "failure where it happens).") from self._failure

    @contextmanager
    def partner(self, model: nn.Module) -> Iterator[None]:
        """Run the body with the EMA partner's values in every trainable tensor."""
        values = self._partner if self._partner_cast is None else self._partner_cast
        with self._swapped(model, self.names, values, "partner"):
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
        self.wait_for_update()  # the partner's values and the backup (staging) buffer are the update's until done
        live = self._live(model, names)
        backup = [self._backup[n] for n in names]
        # host storage: asynchronous copies from/to pinned buffers, ordered on the current stream (backup before
        # overwrite, restore after the body's kernels); on-device storage ignores non_blocking
        with torch.no_grad():
            _copy_all(backup, live)
            self._active = what
        try:
            with torch.no_grad():  # casts the on-device fp32 partner to the param dtype
                _copy_all(live, [values[n] for n in names])
            yield
        finally:
            with torch.no_grad():
                _copy_all(live, backup)
            self._active = None

    # ---- checkpoints and accounting ------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Partner shadow, reference snapshot and counters. The reference is saved too: after a resume the live
        weights are the trained policy, so it cannot be re-taken from the model. Waits for a pending update."""
        self.wait_for_update()
        return {"ema_decay": self.ema_decay, "num_updates": self.num_updates,
                "partner": dict(self._partner), "reference": None if self._reference is None else dict(self._reference)}

    @torch.no_grad()
    def load_state_dict(self, state: Mapping) -> None:
        """Copy a ``state_dict()`` back in after checking names, shapes and that the reference setting matches.

        ``ema_decay`` stays the constructor's (the config's), so a changed decay on resume takes effect. A pending
        update is waited for first (it would otherwise land on the loaded values); a failed one is forgotten, since
        the loaded state replaces everything it could have touched."""
        try:
            self.wait_for_update()
        except RuntimeError:
            pass  # a failed update stays recorded until the loaded values below have replaced the shadow
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
        if self._partner_cast is not None:
            foreach_copy_([self._partner_cast[n] for n in self.names], [self._partner[n] for n in self.names])
        self.num_updates = int(state["num_updates"])
        self._failure = None

    def memory(self) -> WeightSetMemory:
        """Bytes held by the partner shadow, the reference snapshot and the swap buffer."""
        return WeightSetMemory(
            partner_bytes=_nbytes(list(self._partner.values())),
            reference_bytes=_nbytes(list((self._reference or {}).values())),
            swap_buffer_bytes=_nbytes(list(self._backup.values())),
            partner_cast_bytes=_nbytes(list((self._partner_cast or {}).values())),
            storage_device=self.storage_device,
        )
