"""Read a DeepSpeed ZeRO checkpoint directory into one state dict, without DeepSpeed installed.

XTuner's ``guess_load_checkpoint(path)`` treats a *directory* ``path`` (e.g. ``work_dirs/sa2va_4b/iter_5000.pth/``
written by MMEngine's ``DeepSpeedStrategy`` with ``save_optimizer=True``) as one DeepSpeed checkpoint tag and
rebuilds the full state from it. This module does the same from the files alone:

* ``mp_rank_00_model_states.pt`` (ZeRO-1/2) or ``zero_pp_rank_<r>_mp_rank_00_model_states.pt`` (ZeRO-3, one per
  rank): ``module`` (buffers are read from it), ``buffer_names``, ``param_shapes`` (one ordered {name: shape} per
  optimizer group, the order of the flat fp32 vector), ``frozen_param_shapes`` / ``frozen_param_fragments``
  (parameters without grad, saved when gradients are partitioned), ``shared_params`` ({alias: owner}).
* ``*_optim_states.pt`` (one per data-parallel rank, natural sort order): ``optimizer_state_dict`` with
  ``zero_stage``, ``partition_count`` and the fp32 master weights: ``single_partition_of_fp32_groups`` (stage
  1/2: one flat slice of every group per rank; the ranks' slices concatenate to the group's flat vector, padded
  to a multiple of 2·world_size) or ``fp32_flat_groups`` (stage 3: every parameter is split into world_size
  equal chunks, the last rank's padded, and each rank stores its chunks back to back).

Sources read for the layout (facts only): deepspeed 0.16.2 ``runtime/engine.py`` (``_save_checkpoint``,
``_get_zero_param_shapes``, ``_get_zero_frozen_param_attributes``) and ``utils/zero_to_fp32.py``; xtuner 0.2.0
``model/utils.py`` ``guess_load_checkpoint`` and ``utils/zero_to_any_dtype.py``.
Differs from xtuner: trainable tensors come back as the fp32 masters (xtuner casts them to fp16 by default) and
buffers keep their saved dtype.
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch

MODEL_STATES_ZERO12 = "mp_rank_00_model_states.pt"
MODEL_STATES_GLOB = "*_model_states.pt"
OPTIM_STATES_GLOB = "*_optim_states.pt"


def is_deepspeed_checkpoint(path: str | Path) -> bool:
    """True for a directory holding DeepSpeed ``*_model_states.pt`` files (one checkpoint tag)."""
    path = Path(path)
    return path.is_dir() and any(path.glob(MODEL_STATES_GLOB))


def _natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


# ---------------------------------------------------------------------------------------------- unpickling
class _Missing:
    """Stands in for a DeepSpeed class (``LossScaler``, ``ZeroStageEnum`` ...) when DeepSpeed is not installed;
    ``int()`` gives the value an enum member was pickled with."""

    def __init__(self, *args):
        self.args = args

    def __setstate__(self, state) -> None:
        self.state = state

    def __int__(self) -> int:
        return int(self.args[0])


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            if module.split(".")[0] == "deepspeed":
                return _Missing
            raise


_PICKLE = SimpleNamespace(Unpickler=_Unpickler, load=pickle.load, __name__="pickle")


def _load(file: Path) -> dict:
    try:
        return torch.load(file, map_location="cpu", weights_only=False, pickle_module=_PICKLE)
    except Exception as err:  # a truncated zip, a foreign pickle: name the file
        raise ValueError(f"{file}: cannot read this DeepSpeed checkpoint file ({type(err).__name__}: {err})") from err


# ---------------------------------------------------------------------------------------------- reading
def _files(path: Path, pattern: str) -> list[Path]:
    files = sorted(path.glob(pattern), key=_natural_key)
    if not files:
        hint = ""
        if (path / "latest").is_file() or any(p.is_dir() and any(p.glob(pattern)) for p in path.iterdir()):
            hint = " It looks like the folder *above* a checkpoint tag; pass the tag directory (e.g. iter_500.pth/)."
        raise FileNotFoundError(f"{path}: no {pattern} files; not a DeepSpeed checkpoint directory.{hint}")
    return files


def read_zero_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """The consolidated state dict of the DeepSpeed checkpoint tag directory ``path``: buffers, frozen parameters
    (when saved) and the fp32 master weights of the trainable parameters, under ``named_parameters`` names."""
    path = Path(path)
    optim = [_load(f)["optimizer_state_dict"] for f in _files(path, OPTIM_STATES_GLOB)]
    if "zero_stage" not in optim[0]:
        raise ValueError(f"{path}: the optimizer states have no 'zero_stage'; not a ZeRO checkpoint (stage 0 "
                         "checkpoints keep full weights in mp_rank_00_model_states.pt 'module').")
    stage = int(optim[0]["zero_stage"])
    world = optim[0]["partition_count"]
    world = max(world) if isinstance(world, (list, tuple)) else int(world)
    if world != len(optim):
        raise ValueError(f"{path}: partition_count says {world} ranks but there are {len(optim)} *_optim_states.pt "
                         "files; the checkpoint is incomplete (a rank did not save, or files were overwritten).")
    if stage not in (1, 2, 3):
        raise ValueError(f"{path}: unknown ZeRO stage {stage}")
    model_files = _files(path, MODEL_STATES_GLOB) if stage == 3 else [path / MODEL_STATES_ZERO12]
    if not model_files[0].is_file():
        raise FileNotFoundError(f"{path}: {MODEL_STATES_ZERO12} is missing")
    models = [_load(f) for f in model_files]
    head = models[0]
    for key in ("module", "buffer_names", "param_shapes"):
        if key not in head:
            raise ValueError(f"{model_files[0]}: no {key!r}; not a DeepSpeed model-states file")
    state = {k: v for k, v in head["module"].items() if k in set(head["buffer_names"])}
    frozen = head.get("frozen_param_shapes") or {}
    if stage <= 2:
        state.update({name: head["frozen_param_fragments"][name] for name in frozen})
        state.update(_merge_zero2(head["param_shapes"], [o["single_partition_of_fp32_groups"] for o in optim], world))
    else:
        for name, shape in frozen.items():
            parts = [m["frozen_param_fragments"][name].reshape(-1) for m in models]
            state[name] = torch.cat(parts)[: math.prod(shape)].view(tuple(shape))
        state.update(_merge_zero3(head["param_shapes"], [o["fp32_flat_groups"] for o in optim], world))
    for alias, owner in (head.get("shared_params") or {}).items():
        if owner in state:
            state[alias] = state[owner]
    return state


def _merge_zero2(param_shapes: list[dict], partitions: list[list[torch.Tensor]], world: int) -> dict:
    """Stage 1/2: group g's flat vector = cat(rank slices); parameters follow in ``param_shapes[g]`` order."""
    out = {}
    for g, shapes in enumerate(param_shapes):
        flat = torch.cat([rank_groups[g] for rank_groups in partitions])  # [Σ numel + padding]
        offset = 0
        for name, shape in shapes.items():
            numel = math.prod(shape)
            if offset + numel > flat.numel():
                raise ValueError(f"ZeRO checkpoint group {g}: {name} needs values {offset}..{offset + numel} but the "
                                 f"fp32 partitions hold {flat.numel()}; the model-states and optimizer files do not "
                                 "match.")
            out[name] = flat.narrow(0, offset, numel).view(tuple(shape)).clone()
            offset += numel
        align = 2 * world  # ZeRO-2 pads each group to a multiple of 2·world_size
        if math.ceil(offset / align) * align != math.ceil(flat.numel() / align) * align:
            raise ValueError(f"ZeRO checkpoint group {g}: the parameter shapes cover {offset} values but the fp32 "
                             f"partitions hold {flat.numel()}; the model-states and optimizer files do not match.")
    return out


def _merge_zero3(param_shapes: list[dict], flat_groups: list[list[torch.Tensor]], world: int) -> dict:
    """Stage 3: parameter p occupies ceil(numel/world) values on every rank, at the same offset."""
    shapes = {name: shape for group in param_shapes for name, shape in group.items()}
    per_rank = [torch.cat([t.reshape(-1) for t in groups]) for groups in flat_groups]  # [N_rank] each
    out, offset, held = {}, 0, per_rank[0].numel()
    for name, shape in shapes.items():
        numel = math.prod(shape)
        chunk = math.ceil(numel / world)
        if offset + chunk > held:
            raise ValueError(f"ZeRO-3 checkpoint: {name} needs values {offset}..{offset + chunk} of each rank but a "
                             f"rank holds {held}; the model-states and optimizer files do not match.")
        parts = [flat[offset:offset + chunk] for flat in per_rank]
        out[name] = torch.cat(parts)[:numel].view(tuple(shape)).clone()
        offset += chunk
    if offset != held:
        raise ValueError(f"ZeRO-3 checkpoint: the parameter shapes cover {offset} values per rank but each rank "
                         f"holds {held}; the model-states and optimizer files do not match.")
    return out


SHM_COMM_OP = "deepspeed_shm_comm"


@contextlib.contextmanager
def without_shm_comm_op() -> Iterator[None]:
    """DeepSpeed process groups started inside the block skip DeepSpeed's shared-memory all-reduce op.

    On the CPU accelerator ``deepspeed.init_distributed`` JIT-compiles that op with ninja the first time on a machine
    (~37 s on 2 idle cores, minutes when test workers compete for the build lock). ZeRO training never calls it: only
    ``inference_all_reduce`` does, and that falls back to ``torch.distributed``. ``build_shm_op`` skips ops that
    ``deepspeed.ops.__compatible_ops__`` marks incompatible, so the op is marked so inside the block and the entry
    restored afterwards. A no-op without DeepSpeed installed.
    """
    if importlib.util.find_spec("deepspeed") is None:
        yield
        return
    from deepspeed.ops import __compatible_ops__ as compatible_ops

    with mock.patch.dict(compatible_ops, {SHM_COMM_OP: False}):
        yield
