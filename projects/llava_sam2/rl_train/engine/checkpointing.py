"""Checkpoint helpers: trainable-only model state, RNG state, and state that hooks own beside the checkpoint.

MMEngine checkpoints hold the model, optimizer, parameter schedulers, message hub and meta. Two gaps matter for
an exact GRPO resume, and this module closes them:

* Hooks with their own state (the EMA partner, the RNG streams) subclass :class:`StatefulHook`. Under ``Runner``
  that state goes into the checkpoint dict through ``before_save_checkpoint`` / ``after_load_checkpoint``. Two
  cases cannot use those stages: ``FlexibleRunner`` (DeepSpeed) never calls them (docs/stack.md §6), and
  ``Runner.save_checkpoint`` runs on rank 0 only, so per-rank state (RNG) of other ranks never reaches it. There the
  state is written to a side file ``<checkpoint>.<state_name>.pth`` by ``AtomicCheckpointHook``
  (hooks/checkpoint.py) before it commits the checkpoint, and read back by ``TrainStateHook`` on resume.
* Model state: ``keep_trainable_state`` makes ``state_dict`` hold only the trainable tensors (as upstream SFT
  checkpoints do) and makes loading such a state dict report no missing frozen keys.

Two checks on resume: the process count the checkpoint was saved with (``meta['world_size']``, ``check_world_size``)
and the learning rate (``apply_configured_lr``: the config's ``optim_wrapper.optimizer.lr`` wins over the optimizer
and scheduler state in the checkpoint, with a warning, so a resume with a lower lr is a way out of a diverged run).
"""
from __future__ import annotations

import glob
import logging
import math
import os
import random
from typing import Any

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_world_size, is_main_process
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.runner import FlexibleRunner
from mmengine.runner.checkpoint import find_latest_checkpoint
from torch import nn

from .atomic_files import PARTIAL_SUFFIX, commit
from .guard import torch_optimizers
from .mmengine_seams import resume_request
CONFIGURED_LR = "configured_lr"  # message-hub entry: optim_wrapper.optimizer.lr of the run, carried in checkpoints


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's model inside DDP / DeepSpeed / FSDP wrappers (``MMDeepSpeedEngineWrapper.module`` included)."""
    return model.module if is_model_wrapper(model) else model


def is_flexible_runner(runner) -> bool:
    return isinstance(runner, FlexibleRunner)


# ---- model state: trainable tensors only -------------------------------------------------------------------


def keep_trainable_state(module: nn.Module) -> None:
    """Register hooks so ``module.state_dict()`` keeps only ``requires_grad`` parameters and loading it back
    does not report the frozen tensors as missing.

    Post hooks (not a ``state_dict`` override) because MMEngine saves with ``get_state_dict`` and loads with its
    own recursive ``load_state_dict``; both call the module's registered hooks. A trainable tensor missing from a
    loaded state dict is still reported (and raises under ``strict=True``).
    """

    def frozen_names() -> set[str]:
        return ({name for name, param in module.named_parameters() if not param.requires_grad}
                | {name for name, _ in module.named_buffers()})

    def drop_frozen(mod, state_dict, prefix, local_metadata) -> None:
        frozen = {prefix + name for name in frozen_names()}
        for key in [k for k in state_dict if k in frozen]:
            del state_dict[key]

    def ignore_frozen_missing(mod, incompatible_keys) -> None:
        # Keys are relative to the module being loaded: ours once wrappers are stripped, as MMEngine and
        # DeepSpeed both do before loading.
        frozen = frozen_names()
        incompatible_keys.missing_keys[:] = [k for k in incompatible_keys.missing_keys if k not in frozen]

    module.register_state_dict_post_hook(drop_frozen)
    module.register_load_state_dict_post_hook(ignore_frozen_missing)


# ---- RNG state -----------------------------------------------------------------------------------------------


def capture_rng_state() -> dict[str, Any]:
    """The global random streams of this process: Python ``random``, NumPy, torch CPU and (if present) CUDA."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`. The generator states go back as CPU byte tensors whatever device the
    checkpoint was loaded to (a one-process GPU run's resume maps the checkpoint dict to its GPU)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(_byte_state(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_byte_state(s) for s in state["cuda"]])


def _byte_state(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(device="cpu", dtype=torch.uint8)


# ---- side files ----------------------------------------------------------------------------------------------


def side_file(checkpoint: str, state_name: str) -> str:
    """``<checkpoint>.<state_name>.pth``, next to a checkpoint file or DeepSpeed checkpoint directory."""
    return f"{os.fspath(checkpoint).rstrip(os.sep)}.{state_name}.pth"


def write_side_file(checkpoint: str, state_name: str, state: Any) -> str:
    """Save ``state`` atomically and durably (temp file, fsync, rename) next to ``checkpoint``; returns the path."""
    path = side_file(checkpoint, state_name)
    torch.save(state, path + PARTIAL_SUFFIX)
    commit(path + PARTIAL_SUFFIX, path)
    return path


def write_side_states(runner, checkpoint: str) -> list[str]:
    """Write the side file of every ``StatefulHook`` whose state the checkpoint dict cannot carry (all ranks call
    this: per-rank states are gathered to rank 0, which writes). Returns the paths written (rank 0)."""
    written = []
    for hook in [h for h in runner.hooks if isinstance(h, StatefulHook) and h.uses_side_file(runner)]:
        state = hook.state_dict(runner)
        if hook.is_per_rank:
            state = all_gather_object(state)  # one entry per rank, every rank takes part
        if is_main_process():
            written.append(write_side_file(checkpoint, hook.state_name, state))
    return written


def read_side_file(checkpoint: str, state_name: str) -> Any:
    path = side_file(checkpoint, state_name)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"resume from {checkpoint}: the side file {path} with the {state_name!r} state is missing; it is written "
            "next to each checkpoint by AtomicCheckpointHook. Copy it along with the checkpoint, or remove the hook "
            f"that owns {state_name!r} from the config's hooks (the shipped configs name them in default_hooks) to "
            "resume without that state.")
    return torch.load(path, map_location="cpu", weights_only=False)


def prune_side_files(checkpoint_dir: str) -> list[str]:
    """Delete side files whose checkpoint is gone (pruned by ``max_keep_ckpts``, or never committed because the
    run died while saving it). Call it only while no checkpoint is being saved."""
    removed = []
    for path in glob.glob(os.path.join(checkpoint_dir, "*.pth.*.pth")):
        checkpoint = path[: path.index(".pth.") + len(".pth")]
        if not os.path.exists(checkpoint):
            os.remove(path)
            removed.append(path)
    return removed


def saved_world_size(checkpoint: str) -> int | None:
    """The process count a checkpoint file records (``meta['world_size']``, written by ``AtomicCheckpointHook``);
    None for a DeepSpeed directory or a checkpoint without it."""
    if not os.path.isfile(checkpoint):
        return None
    meta = torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True).get("meta") or {}
    return meta.get("world_size")


def check_world_size(saved: int | None, checkpoint: str) -> None:
    """Raise if ``checkpoint`` was saved by ``saved`` processes and this run has another count (None: unknown)."""
    if saved is not None and saved != get_world_size():
        raise ValueError(
            f"resume from {checkpoint}: it was saved by a run of {saved} process(es) and this run has "
            f"{get_world_size()}. The checkpoint holds each rank's random streams and data position, so an exact "
            f"resume needs {saved} process(es): relaunch with that many, or start a new run from its weights "
            f"(--cfg-options load_from={checkpoint}, without --resume; optimizer state and schedule start afresh).")


def apply_configured_lr(runner, restored_optimizer: bool = True, restored_schedulers: bool = True) -> None:
    """Record the config's learning rate in the message hub; on a resume whose checkpoint was saved with another
    one, scale every parameter group's ``lr`` / ``initial_lr`` and the lr schedulers' ``base_values`` by
    configured / saved (per-group multipliers and the schedule's shape are kept) and log a warning. Only state that
    came from the checkpoint is scaled (``restored_*``: the checkpoint hook saves it); state built afresh already
    holds the config's lr."""
    optimizer_cfg = (runner.cfg.get("optim_wrapper") or {}).get("optimizer") or {}
    configured = optimizer_cfg.get("lr") if hasattr(optimizer_cfg, "get") else None
    if not isinstance(configured, (int, float)):
        return
    hub = runner.message_hub
    saved = hub.get_info(CONFIGURED_LR)
    hub.update_info(CONFIGURED_LR, float(configured))
    if runner.iter == 0:  # a fresh run (load_from loads weights only): the optimizer was built with the config's lr
        return
    optimizers = torch_optimizers(runner.optim_wrapper) if restored_optimizer else []
    if saved is None and optimizers:  # a checkpoint saved before the entry existed: its first group's base lr
        group = optimizers[0].param_groups[0]
        saved = group.get("initial_lr", group["lr"])
    if saved is None or math.isclose(saved, configured, rel_tol=1e-9):
        return
    scale = configured / saved
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] *= scale
            if "initial_lr" in group:
                group["initial_lr"] *= scale
    schedulers = (runner.param_schedulers or []) if restored_schedulers else []
    for scheduler in schedulers.values() if isinstance(schedulers, dict) else schedulers:
        for one in scheduler if isinstance(scheduler, list) else [scheduler]:
            if getattr(one, "param_name", None) == "lr":
                one.base_values = [value * scale for value in one.base_values]
    print_log(f"resume: optim_wrapper.optimizer.lr={configured:g} differs from the lr the checkpoint was saved with "
              f"({saved:g}); the optimizer and scheduler state from the checkpoint now use the config's lr: every "
              f"parameter group's lr scaled by {scale:.4g}; the schedule continues from iteration {runner.iter + 1}.",
              logger="current", level=logging.WARNING)


def resumed_checkpoint(runner) -> str | None:
    """The checkpoint this run resumes from, resolved as ``Runner.load_or_resume`` does (None: fresh run)."""
    resume, load_from = resume_request(runner)
    if not resume:
        return None
    if isinstance(resume, str):  # FlexibleRunner accepts resume=<path>
        return resume
    return load_from if load_from is not None else find_latest_checkpoint(runner.work_dir)


# ---- hooks that own state -------------------------------------------------------------------------------------


class StatefulHook(Hook):
    """A hook with training state that must survive a resume (subclasses: EMAPartnerHook, TrainStateHook).

    Subclasses set ``state_name`` (checkpoint key and side-file suffix) and ``is_per_rank`` (the state differs
    between ranks, like RNG streams) and implement ``state_dict`` / ``load_state_dict``. ``load_state_dict`` is
    called when a checkpoint is read, which may be before the hook's objects exist (``Runner`` resumes before the
    train loop builds the algorithm), so it should keep the state until it can be applied.
    """

    state_name: str = ""
    is_per_rank: bool = False

    def state_dict(self, runner) -> Any:
        raise NotImplementedError

    def load_state_dict(self, runner, state: Any) -> None:
        raise NotImplementedError

    def uses_side_file(self, runner) -> bool:
        """True where the checkpoint dict cannot carry this state (see the module docstring)."""
        return is_flexible_runner(runner) or (self.is_per_rank and get_world_size() > 1)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if not self.uses_side_file(runner):
            checkpoint[self.state_name] = self.state_dict(runner)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if not self.uses_side_file(runner) and self.state_name in checkpoint:
            self.load_state_dict(runner, checkpoint[self.state_name])
