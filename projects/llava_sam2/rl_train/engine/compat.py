"""Fixes that let MMEngine / DeepSpeed distributed launches run on CPU-only machines (CI, laptops).

Applied by ``tools/train.py`` before the runner is built, and only when CUDA is absent; on a GPU machine
``apply_cpu_compat`` changes nothing (environment.md facts 15 and 16):

* ``mmengine.dist`` calls ``torch.cuda.set_device(LOCAL_RANK)`` for every ``--launcher pytorch`` run, which raises
  "Found no NVIDIA driver" without a GPU: it becomes a no-op.
* ``Runner.wrap_model`` passes ``device_ids=[LOCAL_RANK]`` to ``MMDistributedDataParallel``; DDP rejects
  ``device_ids`` for CPU modules: they are dropped.
* DeepSpeed JIT-compiles a shared-memory all-reduce op (``deepspeed_shm_comm``, ~40-75 s with ninja) the first time
  it starts a CPU process group; it is marked unavailable so collectives go through gloo.
* Intra-op threads: unless the user set ``OMP_NUM_THREADS``, a CPU run uses ``CPU_THREADS`` = 1 thread per process
  (``torch.set_num_threads`` here, ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` for child processes). The CPU configs
  are the tiny ones, whose ops are too small for a second thread to pay, and OpenMP spin-waiting makes extra
  threads very slow on shared cores (tiny GRPO config: docs/benchmarks.md "CPU threads"). torchrun already does
  the same for multi-process launches.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import os

import torch

logger = logging.getLogger(__name__)
CPU_THREADS = 1  # intra-op threads per CPU process when OMP_NUM_THREADS is unset (module doc)

_PATCHED = False


def _noop_set_device(device) -> None:
    """CPU stand-in for ``torch.cuda.set_device``: there is no device to select."""


def _drop_ddp_device_ids() -> None:
    from mmengine.model import MMDistributedDataParallel

    original_init = MMDistributedDataParallel.__init__

    @functools.wraps(original_init)
    def init_without_device_ids(self, module, *args, **kwargs):
        kwargs.pop("device_ids", None)
        kwargs.pop("output_device", None)
        original_init(self, module, *args, **kwargs)

    MMDistributedDataParallel.__init__ = init_without_device_ids


def _skip_deepspeed_shm_op() -> None:
    if importlib.util.find_spec("deepspeed") is None:
        return
    from deepspeed.ops import __compatible_ops__ as compatible_ops

    compatible_ops["deepspeed_shm_comm"] = False


def set_cpu_threads(threads: int = CPU_THREADS) -> int:
    """Use ``threads`` intra-op threads unless ``OMP_NUM_THREADS`` is set (the user's choice wins); returns the
    count in use."""
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # DataLoader workers and other children
        os.environ.setdefault(name, str(threads))
    torch.set_num_threads(threads)
    logger.info("CPU run: %d intra-op thread(s) per process (set OMP_NUM_THREADS to choose another count)", threads)
    return threads


def apply_cpu_compat() -> bool:
    """Apply the CPU fixes once if CUDA is unavailable; returns True when they are (or already were) applied."""
    global _PATCHED
    if torch.cuda.is_available():
        return False
    if not _PATCHED:
        torch.cuda.set_device = _noop_set_device
        _drop_ddp_device_ids()
        _skip_deepspeed_shm_op()
        set_cpu_threads()
        _PATCHED = True
    return True
