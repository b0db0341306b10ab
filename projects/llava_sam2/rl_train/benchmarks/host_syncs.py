"""Count the calls that would make the host wait for the accelerator, on CPU.

On CUDA, reading a device value on the host (``.item()``, ``bool(t)``, ``.tolist()``, ``.cpu()``), an op whose output
shape depends on device values (``nonzero``, boolean-mask indexing, ``unique``, ``repeat_interleave`` without
``output_size``) and a blocking host-to-device copy (``torch.tensor(..., device=...)``) each block the host until the
stream has drained; the host's launch overhead is then no longer hidden behind queued GPU work. On CPU nothing
blocks, so :class:`HostSyncCounter` records such calls instead, with the Python location that made each, and the
phase it ran in.

On CPU every tensor is a host tensor, so the counter infers where each tensor would live on an accelerator run and
skips calls whose tensors are all host-side. A tensor is host-side when it was made inside the block by a factory
without a ``device`` (or with the string ``"cpu"``), by ``.cpu()`` / ``.to("cpu")``, by ``mark_host``, or by an op
whose tensor inputs are all host-side; a ``device`` given as a ``torch.device`` (a tensor's or the model's, which is
the CPU on a CPU run) and ``.to(device)`` make a device tensor; tensors made before the block count as device
tensors unless marked, as do tensors made on another thread (a torch function mode holds for its own thread). The
inference is an approximation: read the reported locations.

A blocking copy of a host tensor to the device (``.to(device)``, ``.cuda()``) counts as ``to_device``: torch waits
for the stream after it; ``non_blocking=True`` copies do not count. What the mode does not see: calls made inside
C++ (an op that syncs internally, the autograd engine's backward ops), ``torch.cuda.synchronize`` and event or
stream waits (not tensor functions).

    with HostSyncCounter(phase=lambda: clock.open_phases[0] if clock.open_phases else "-") as syncs:
        ...
    print(syncs.table())
"""
from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

_T = torch.Tensor
# each function that reads device values on the host, by the kind it is reported as
_ALWAYS = {
    _T.item: "item", _T.tolist: "tolist", _T.__bool__: "bool", _T.__int__: "int", _T.__float__: "float",
    _T.__index__: "index", _T.__format__: "format", _T.numpy: "numpy", _T.cpu: "cpu",
    torch.nonzero: "nonzero", _T.nonzero: "nonzero", torch.argwhere: "nonzero", _T.argwhere: "nonzero",
    torch.masked_select: "masked_select", _T.masked_select: "masked_select",
    torch.unique: "unique", _T.unique: "unique", torch.unique_consecutive: "unique",
    _T.unique_consecutive: "unique", torch.equal: "equal", _T.equal: "equal",
}
_REPEAT_INTERLEAVE = (torch.repeat_interleave, _T.repeat_interleave)
_NEW_TENSOR = (torch.tensor, torch.as_tensor)
_HOST = "_host_syncs_host_side"  # attribute set on the tensors inferred to be host-side
_TORCH_DIR = os.path.dirname(torch.__file__)
_THIS_FILE = os.path.abspath(__file__)


def _has_bool_tensor(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(item, torch.Tensor) and item.dtype == torch.bool for item in items)


def sync_kind(func, args, kwargs) -> str | None:
    """The kind of host synchronisation ``func(*args, **kwargs)`` makes on CUDA, or None."""
    kind = _ALWAYS.get(func)
    if kind is not None:
        return kind
    if func in (_T.__getitem__, _T.__setitem__):
        return ("mask_index" if func is _T.__getitem__ else "mask_assign") if _has_bool_tensor(args[1]) else None
    if func is _T.cuda:
        return None if kwargs.get("non_blocking") else "to_device"
    if func in _REPEAT_INTERLEAVE:
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        output_size = kwargs.get("output_size")
        if isinstance(repeats, torch.Tensor) and repeats.numel() > 1 and output_size is None:
            return "repeat_interleave"
        return None
    if func in _NEW_TENSOR:  # a pageable host-to-device copy waits for the stream
        if args and isinstance(args[0], torch.Tensor) and not is_host(args[0]):
            return None  # already a device tensor: no copy
        # on a CPU run the device is the CPU too: every explicit device counts, read the location to classify
        return "new_tensor_on_device" if kwargs.get("device") is not None else None
    if func is _T.to:
        device = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device))), None))
        if device is None:
            return None
        # a literal "cpu" names the host; a torch.device is usually a tensor's own device (cpu on a CPU run)
        if kwargs.get("non_blocking"):  # an asynchronous copy: the host does not wait
            return None
        return "to_cpu" if device == "cpu" else "to_device"
    return None


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def is_host(tensor: torch.Tensor) -> bool:
    return getattr(tensor, _HOST, False)


def mark_host(*tensors: torch.Tensor) -> None:
    """Declare ``tensors`` host-side (e.g. data-loader tensors made before the counted block)."""
    for tensor in tensors:
        setattr(tensor, _HOST, True)


def _output_is_host(func, args, kwargs, inputs: list[torch.Tensor]) -> bool:
    if func in (_T.cpu, _T.numpy):
        return True
    if func is _T.cuda:
        return False
    if func is _T.to:
        target = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device))), None))
        if target is not None:
            return target == "cpu"
        other = next((a for a in args[1:] if isinstance(a, torch.Tensor)), kwargs.get("other"))
        return is_host(other if other is not None else args[0])
    if "device" in kwargs and kwargs["device"] is not None:
        return kwargs["device"] == "cpu"
    return all(is_host(t) for t in inputs)  # no tensor input: a factory on the default (host) device


def caller(skip: tuple[str, ...] = ()) -> str:
    """``file:line function`` of the innermost frame outside torch, this module and ``skip`` (paths relative to the
    working directory where possible)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not (path.startswith(_TORCH_DIR) or os.path.abspath(path) == _THIS_FILE
                or any(part in path for part in skip) or path.startswith("<")):
            rel = os.path.relpath(path)
            return f"{path if rel.startswith('..') else rel}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


class HostSyncCounter(TorchFunctionMode):
    """A torch function mode counting :func:`sync_kind` calls by (phase, kind, location).

    Args:
        phase: returns the name of the phase running now (default: one phase, ``"-"``).
        kinds: count only these kinds (default: all).
        skip: path fragments whose frames are not reported as the location (e.g. a wrapper of the code studied).
    """

    def __init__(self, phase: Callable[[], str] | None = None, kinds: set[str] | None = None,
                 skip: tuple[str, ...] = ()):
        super().__init__()
        self.phase = phase or (lambda: "-")
        self.kinds = kinds
        self.skip = skip
        self.counts: Counter[tuple[str, str, str]] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "__get__":  # attribute reads (.shape, .device, ...)
            return func(*args, **kwargs)
        inputs = list(_tensors(args)) + list(_tensors(kwargs))
        output_host = _output_is_host(func, args, kwargs, inputs)
        kind = sync_kind(func, args, kwargs)
        # a read of host-side tensors only waits for nothing; a new tensor or copy counts by where it lands
        inputs_host = all(is_host(t) for t in inputs)
        on_device = {"new_tensor_on_device": not output_host,
                     "to_device": inputs_host and not output_host}.get(kind, not inputs_host)
        if kind is not None and on_device and (self.kinds is None or kind in self.kinds):
            self.counts[(self.phase(), kind, caller(self.skip))] += 1
        out = func(*args, **kwargs)
        if func in (_T.cpu, _T.cuda, _T.to) and out is args[0] and output_host != is_host(out):
            out = out.view_as(out)  # a copy on a device run: a new tensor, marked apart from its source
        if output_host:
            for tensor in _tensors(out):
                if any(tensor is t for t in inputs):
                    continue
                try:
                    mark_host(tensor)
                except (AttributeError, RuntimeError):  # a tensor type without attributes: left unmarked
                    pass
        return out

    def total(self, phase: str | None = None, where: str | None = None) -> int:
        """Calls counted, in ``phase`` and at locations containing ``where`` when given."""
        return sum(n for (p, _, loc), n in self.counts.items()
                   if (phase is None or p == phase) and (where is None or where in loc))

    def by_phase(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (phase, _, _), n in self.counts.items():
            out[phase] += n
        return dict(out)

    def table(self) -> str:
        """One line per (phase, kind, location), phases in first-seen order, most calls first within a phase."""
        order = list(dict.fromkeys(p for p, _, _ in self.counts))
        lines = [f"{'phase':<28} {'kind':<20} {'count':>6}  location"]
        for phase in order:
            rows = sorted(((n, k, loc) for (p, k, loc), n in self.counts.items() if p == phase), reverse=True)
            lines += [f"{phase:<28} {k:<20} {n:>6}  {loc}" for n, k, loc in rows]
            lines.append(f"{phase:<28} {'TOTAL':<20} {sum(r[0] for r in rows):>6}")
        return "\n".join(lines)
