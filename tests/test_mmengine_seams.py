"""Canaries for the MMEngine internals Sa2VA-RL relies on (engine/mmengine_seams.py, engine/iteration_loop.py).

Each test names the installed MMEngine version and what changed when an upgrade breaks an assumption; the table in
docs/architecture.md ("MMEngine seams") says why each seam exists.
"""
import importlib
import importlib.util
import inspect
import warnings

import mmengine
import pytest
import torch
from mmengine.dataset import DefaultSampler
from mmengine.model import MMDistributedDataParallel
from mmengine.optim.scheduler import LinearLR
from mmengine.runner import FlexibleRunner, Runner
from torch.utils.data import DataLoader

from projects.llava_sam2.rl_train.engine import iteration_loop
from projects.llava_sam2.rl_train.engine.guard import StepGuard
from projects.llava_sam2.rl_train.engine.iteration_loop import InfiniteBatches, IterationLoop
from projects.llava_sam2.rl_train.engine.mmengine_seams import (LOOP_RESUME_ATTRIBUTES, RUNNER_RESUME_ATTRIBUTES,
                                                                SCHEDULER_STEP_MARK, cpu_launch, patched,
                                                                resume_request, stored_config_dict)
from projects.llava_sam2.rl_train.engine.upstream_sft import plain

VERSION = f"mmengine {mmengine.__version__}"


def source(obj) -> str:
    return inspect.getsource(obj)


@pytest.mark.parametrize("runner_cls", [Runner, FlexibleRunner])
def test_resume_writes_the_loop_counters_iteration_loop_keeps(runner_cls):
    text = source(runner_cls.resume)
    for name in LOOP_RESUME_ATTRIBUTES:
        assert f"self.train_loop.{name} = " in text, (
            f"{VERSION}: {runner_cls.__name__}.resume no longer sets train_loop.{name}; IterationLoop "
            "(engine/iteration_loop.py) keeps its counters there, so a resumed GRPO run would restart at iteration "
            f"0. Read the new {runner_cls.__name__}.resume and move the counters where it writes them.")
    for name in LOOP_RESUME_ATTRIBUTES:  # and IterationLoop does keep them there
        assert f"self.{name} = 0" in source(IterationLoop.__init__)


@pytest.mark.parametrize("runner_cls", [Runner, FlexibleRunner])
def test_runner_keeps_its_resume_arguments(runner_cls):
    init = source(runner_cls.__init__)
    for name, argument in zip(RUNNER_RESUME_ATTRIBUTES, ("resume", "load_from")):
        assert argument in inspect.signature(runner_cls.__init__).parameters and f"self.{name} = {argument}" in init, (
            f"{VERSION}: {runner_cls.__name__}.__init__ no longer keeps `{argument}` as self.{name}; "
            "mmengine_seams.resume_request (which finds the checkpoint whose side files TrainStateHook reads on "
            "resume) must read it from where the runner now keeps it (or from a public accessor, if one exists).")

    class Fake:
        _resume, _load_from = True, "a.pth"

    assert resume_request(Fake()) == (True, "a.pth")


def test_scheduler_step_mark_survives_the_step_guard():
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scheduler = LinearLR(optimizer, start_factor=0.5, by_epoch=False, begin=0, end=4)
    assert getattr(optimizer.step, SCHEDULER_STEP_MARK, False), (
        f"{VERSION}: parameter schedulers no longer mark their optimizer.step wrapper with {SCHEDULER_STEP_MARK!r}; "
        "update mmengine_seams.SCHEDULER_STEP_MARK / carry_scheduler_mark (used by engine/guard.py).")
    param.grad = torch.ones(2)
    with StepGuard().installed(optimizer), warnings.catch_warnings():
        warnings.simplefilter("error")  # "Seems like `optimizer.step()` has been overridden ..." would raise
        optimizer.step()
        scheduler.step()
    assert optimizer._global_step == 0  # the scheduler's counting wrapper ran under the guard


def test_cpu_launch_patches_what_mmengine_calls_and_restores_it(monkeypatch):
    init_dist = source(mmengine.dist.utils._init_dist_pytorch)
    assert "torch.cuda.set_device(local_rank)" in init_dist, (
        f"{VERSION}: init_dist (launcher pytorch) no longer calls torch.cuda.set_device; cpu_launch's no-op "
        "set_device may be unnecessary now: drop it if a 2-process CPU run works without it.")
    assert "device_ids" in source(Runner.wrap_model), (
        f"{VERSION}: Runner.wrap_model no longer passes device_ids to DDP; drop cpu_launch's DDP patch.")
    set_device, ddp_init = torch.cuda.set_device, MMDistributedDataParallel.__init__
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with cpu_launch() as is_applied:
        assert is_applied
        torch.cuda.set_device(0)  # no driver needed
        assert MMDistributedDataParallel.__init__ is not ddp_init
        assert inspect.signature(MMDistributedDataParallel.__init__) == inspect.signature(ddp_init)
    assert torch.cuda.set_device is set_device and MMDistributedDataParallel.__init__ is ddp_init


def test_cpu_launch_restores_after_an_error_and_changes_nothing_with_cuda(monkeypatch):
    set_device = torch.cuda.set_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="boom"), cpu_launch():
        raise RuntimeError("boom")
    assert torch.cuda.set_device is set_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with cpu_launch() as is_applied:
        assert not is_applied and torch.cuda.set_device is set_device


@pytest.mark.skipif(not importlib.util.find_spec("deepspeed"), reason="deepspeed not installed")
def test_cpu_launch_turns_off_deepspeeds_shm_op_inside_only(monkeypatch):
    from deepspeed.ops import __compatible_ops__ as compatible_ops

    assert "__compatible_ops__[builder.NAME]" in source(importlib.import_module("deepspeed.comm.torch").build_shm_op), (
        "deepspeed: build_shm_op no longer reads deepspeed.ops.__compatible_ops__; cpu_launch's switch-off of "
        "deepspeed_shm_comm has no effect (a CPU DeepSpeed start JIT-compiles it again).")
    before = compatible_ops.get("deepspeed_shm_comm")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with cpu_launch():
        assert compatible_ops["deepspeed_shm_comm"] is False
    assert compatible_ops.get("deepspeed_shm_comm") == before


def test_patched_restores_an_inherited_attribute_by_deleting_it():
    class Base:
        def f(self):
            return "base"

    class Child(Base):
        pass

    with patched(Child, "f", lambda self: "patched"):
        assert Child().f() == "patched"
    assert "f" not in vars(Child) and Child().f() == "base"


def toy_loader(num_workers: int = 0) -> DataLoader:
    dataset = list(range(5))
    return DataLoader(dataset, batch_size=2, sampler=DefaultSampler(dataset, shuffle=True, seed=3),
                      num_workers=num_workers, collate_fn=list)


def test_infinite_batches_match_mmengines_iterator_and_rng_draws(monkeypatch):
    from mmengine.runner.loops import _InfiniteDataloaderIterator  # the reference, read here only

    torch.manual_seed(0)
    ours = InfiniteBatches(toy_loader())
    ours_batches = [next(ours) for _ in range(7)]  # three epochs of 3 batches (the last one short)
    ours_rng = torch.rand(1)
    torch.manual_seed(0)
    monkeypatch.setattr(mmengine.runner.loops.time, "sleep", lambda seconds: None)
    theirs = _InfiniteDataloaderIterator(toy_loader())
    theirs_batches = [next(theirs) for _ in range(7)]
    assert ours_batches == theirs_batches, (
        f"{VERSION}: InfiniteBatches no longer yields what IterBasedTrainLoop's iterator yields (set_epoch rule?)")
    assert torch.equal(ours_rng, torch.rand(1)), f"{VERSION}: the iterators draw differently from the torch RNG"
    assert ours.epoch == 2 and ours_batches[0] != ours_batches[3]  # reshuffled per epoch


class WorkerLoader:
    """What InfiniteBatches reads of a DataLoader with worker processes (none started)."""

    def __init__(self, persistent_workers: bool) -> None:
        self.num_workers, self.persistent_workers = 2, persistent_workers

    def __iter__(self):
        return iter([[0, 1], [2]])


@pytest.mark.parametrize("loader, pauses", [(toy_loader(), 0), (WorkerLoader(persistent_workers=True), 0),
                                            (WorkerLoader(persistent_workers=False), 1)])
def test_infinite_batches_pause_only_where_workers_restart(monkeypatch, loader, pauses):
    slept = []
    monkeypatch.setattr(iteration_loop.time, "sleep", slept.append)
    batches = InfiniteBatches(loader, pause_s=0.5)
    drawn = [next(batches) for _ in range(3 if isinstance(loader, WorkerLoader) else 4)]  # into the second epoch
    assert batches.epoch == 1 and len(drawn[-1]) > 0
    assert slept == [0.5] * pauses


def test_base_loop_builds_dataloader_configs():
    assert "runner.build_dataloader" in source(mmengine.runner.BaseLoop.__init__), (
        f"{VERSION}: BaseLoop.__init__ no longer builds dataloader configs; IterationLoop (its subclass) and "
        "IterationLoop.build_dataloader (the SFT dataloader) rely on it.")


def test_stored_config_dict_keeps_lazy_objects_unbuilt(tmp_path):
    from mmengine.config import Config, ConfigDict
    from mmengine.config.lazy import LazyObject

    path = tmp_path / "lazy_cfg.py"
    path.write_text("from torch.optim import SGD\n\noptim = dict(type=SGD, lr=0.1)\n")
    cfg = Config.fromfile(str(path))
    raw = stored_config_dict(cfg)
    assert isinstance(raw, ConfigDict), (
        f"{VERSION}: Config no longer keeps its ConfigDict as Config._cfg_dict; mmengine_seams.stored_config_dict "
        "(engine/upstream_sft.py reads upstream SFT configs through it) must find it elsewhere.")
    optim = dict.__getitem__(raw, "optim")
    assert isinstance(dict.__getitem__(optim, "type"), LazyObject), (
        f"{VERSION}: reading a lazy config's stored values no longer leaves `type=Class` unbuilt.")
    assert plain(optim) == {"type": dict.__getitem__(optim, "type"), "lr": 0.1}
    assert stored_config_dict({"a": 1}) == {"a": 1}
