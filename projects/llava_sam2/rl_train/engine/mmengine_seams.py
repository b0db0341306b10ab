"""The one module where Sa2VA-RL relies on MMEngine (and torch / DeepSpeed) internals.

Everything else in ``engine/`` uses public MMEngine API. What is here has no public equivalent in mmengine 0.10.x.
Each item is scoped (a context manager that restores what it changed, or a read of one object) and has a canary in
``tests/test_mmengine_seams.py`` that fails, naming the installed MMEngine version and what changed, when an
upgrade breaks the assumption. docs/architecture.md ("MMEngine seams") has the table.

* ``cpu_launch()``: CPU-only distributed launches (CI, laptops; environment.md facts 15 and 16). While the
  context is open and CUDA is absent:

  - ``torch.cuda.set_device`` is a no-op. ``mmengine.dist.init_dist`` calls ``torch.cuda.set_device(LOCAL_RANK)``
    for every ``--launcher pytorch`` run ("Found no NVIDIA driver" without a GPU); ``Runner`` skips ``init_dist``
    when a process group exists, but ``DeepSpeedStrategy`` always calls it.
  - ``MMDistributedDataParallel`` drops ``device_ids`` / ``output_device``: ``Runner.wrap_model`` passes
    ``device_ids=[LOCAL_RANK]`` to every DDP subclass, also when the config names one in ``model_wrapper_cfg``,
    and DDP rejects ``device_ids`` for CPU modules.
  - DeepSpeed's shared-memory all-reduce op (``deepspeed_shm_comm``, a ~40-75 s JIT compile with ninja the first
    time a CPU process group starts) is marked unavailable, so collectives go through gloo
    (``model/checkpoints/deepspeed_zero.py without_shm_comm_op``, which the tiny ZeRO-2 fixture writer uses too).

* ``resume_request(runner)``: the ``resume`` / ``load_from`` a runner was built with (``Runner`` and
  ``FlexibleRunner`` keep them as ``_resume`` / ``_load_from`` and offer no accessor).
* ``LOOP_RESUME_ATTRIBUTES``: ``Runner.resume`` / ``FlexibleRunner.resume`` write the resumed counters straight into
  ``train_loop._iter`` and ``train_loop._epoch``; a train loop must keep its counters under those names
  (``engine/iteration_loop.py``).
* ``stored_config_dict(cfg)``: the values a ``Config`` file defined, lazy objects (``type=Class`` of a pure-Python
  config) left unbuilt; ``Config``'s accessors build them, which imports the upstream modules they name
  (``engine/upstream_sft.py`` reads upstream SFT configs where those may not be importable).
* ``SCHEDULER_STEP_MARK``: MMEngine's parameter schedulers wrap ``optimizer.step`` and mark the wrapper with
  ``_with_counter``; a wrapper placed over it later must carry the mark (``engine/guard.py``).
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from ..model.checkpoints.deepspeed_zero import without_shm_comm_op

LOOP_RESUME_ATTRIBUTES = ("_iter", "_epoch")  # set on train_loop by Runner.resume / FlexibleRunner.resume
RUNNER_RESUME_ATTRIBUTES = ("_resume", "_load_from")  # Runner / FlexibleRunner.__init__ arguments, kept as is
CONFIG_DICT_ATTRIBUTE = "_cfg_dict"  # where mmengine.Config keeps its ConfigDict
SCHEDULER_STEP_MARK = "_with_counter"  # mmengine.optim.scheduler.param_scheduler marks its optimizer.step wrapper


# ---- CPU-only launches ---------------------------------------------------------------------------------------


def _noop_set_device(device) -> None:
    """CPU stand-in for ``torch.cuda.set_device``: there is no device to select."""


def _without_device_ids(init):
    @functools.wraps(init)
    def init_without_device_ids(self, module, *args, **kwargs):
        kwargs.pop("device_ids", None)
        kwargs.pop("output_device", None)
        init(self, module, *args, **kwargs)

    return init_without_device_ids


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """Set ``owner.name = value`` inside the block; afterwards put back exactly what was there before."""
    had_own = name in vars(owner)
    original = vars(owner)[name] if had_own else None
    setattr(owner, name, value)
    try:
        yield
    finally:
        if had_own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


@contextlib.contextmanager
def cpu_launch() -> Iterator[bool]:
    """Open around a training run (``cli/train.py``): on a machine without CUDA, MMEngine and DeepSpeed
    distributed launches work on CPU inside the block (module docstring); everything is restored on exit. Yields
    True when the fixes are in place, False on a CUDA machine (where it changes nothing)."""
    if torch.cuda.is_available():
        yield False
        return
    from mmengine.model import MMDistributedDataParallel

    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(torch.cuda, "set_device", _noop_set_device))
        stack.enter_context(patched(MMDistributedDataParallel, "__init__",
                                    _without_device_ids(MMDistributedDataParallel.__init__)))
        stack.enter_context(without_shm_comm_op())
        yield True


# ---- reads of runner state without an accessor ---------------------------------------------------------------


def resume_request(runner) -> tuple[Any, str | None]:
    """``(resume, load_from)`` as given to the runner: ``resume`` is a bool (``Runner``) or also a checkpoint path
    (``FlexibleRunner``); ``load_from`` a checkpoint path or None. No public accessor in mmengine 0.10."""
    return getattr(runner, RUNNER_RESUME_ATTRIBUTES[0]), getattr(runner, RUNNER_RESUME_ATTRIBUTES[1])


def stored_config_dict(cfg) -> dict:
    """The ``ConfigDict`` a ``mmengine.Config`` holds (``Config._cfg_dict``; no public accessor returns it with lazy
    objects unbuilt: ``to_dict`` turns them into strings); other mappings are returned as they are. Read its values
    with ``dict.__getitem__`` / ``dict.items`` to keep them unbuilt."""
    return getattr(cfg, CONFIG_DICT_ATTRIBUTE) if hasattr(cfg, CONFIG_DICT_ATTRIBUTE) else cfg


def carry_scheduler_mark(step, wrapper) -> None:
    """Give ``wrapper`` (placed over an optimizer's ``step``) the mark MMEngine's parameter schedulers put on their
    own wrapper, so they do not warn that ``optimizer.step`` was overridden after they were built."""
    if hasattr(step, SCHEDULER_STEP_MARK):
        setattr(wrapper, SCHEDULER_STEP_MARK, getattr(step, SCHEDULER_STEP_MARK))
