"""GraphedCall's capture on a CPU machine: torch.cuda's stream, pool and graph objects are replaced by recorders, so
the test sees what the decode loop asks of CUDA per call (what it must not ask: a device synchronisation or an emptied
allocator cache per capture)."""
from contextlib import nullcontext

import pytest
import torch

from projects.llava_sam2.rl_train.model.decoding import fast_decode_step
from projects.llava_sam2.rl_train.model.decoding.fast_decode_step import GraphedCall



class _Stream:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait_stream(self, other):
        self.log.append(("wait", self.name, other.name))


class _Graph:
    made = 0

    def __init__(self, log):
        self.log = log
        _Graph.made += 1
        self.id = ("pool", _Graph.made)

    def capture_begin(self, pool=None, capture_error_mode="global"):
        self.log.append(("capture_begin", pool, capture_error_mode))
        if pool is not None:
            self.id = pool

    def pool(self):
        return self.id

    def capture_end(self):
        self.log.append(("capture_end",))

    def replay(self):
        self.log.append(("replay",))


class _Output:
    """A step's output: records the stream it is handed to (a CPU tensor's record_stream takes no fake stream)."""

    def __init__(self, log, value):
        self.log, self.value = log, value

    def record_stream(self, stream):
        self.log.append(("record_stream", stream.name))


def _forbidden(name):
    def call(*args, **kwargs):
        raise AssertionError(f"GraphedCall called {name}")
    return call


@pytest.fixture
def cuda_log(monkeypatch):
    log = []
    main = _Stream(log, "main")
    monkeypatch.setattr(torch.cuda, "device", lambda device: nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: main)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: _Stream(log, "side"))
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda *a, **k: _Graph(log))
    for name in ("synchronize", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, _forbidden(f"torch.cuda.{name}"))
    monkeypatch.setattr(torch._C, "_host_emptyCache", _forbidden("torch._C._host_emptyCache"))
    clear = getattr(fast_decode_step, "_device_graphs", None)
    if clear is not None:
        clear.cache_clear()
    yield log
    if clear is not None:
        clear.cache_clear()


def test_graphed_call_captures_without_synchronising_or_emptying_caches(cuda_log):
    calls = []

    def step():
        calls.append(len(calls))
        return _Output(cuda_log, len(calls))

    graphed = GraphedCall(step, torch.device("cuda", 0), warmup=1)
    warm = graphed()  # an eager step on the side stream
    assert warm.value == 1
    captured = graphed()  # recorded (fn runs once while recording) and replayed
    again = graphed()  # replay only
    assert len(calls) == 2
    assert captured is again and captured.value == 2
    assert [e for e in cuda_log if e[0] != "wait"] == [
        ("record_stream", "main"), ("capture_begin", None, "thread_local"), ("capture_end",), ("replay",),
        ("replay",)]
    # each eager/capture call orders the side stream after the main stream's work and the main stream after it
    assert cuda_log.count(("wait", "side", "main")) == 2 and cuda_log.count(("wait", "main", "side")) == 2


def test_graphed_calls_of_one_device_share_one_pool_and_stream(cuda_log):
    first = GraphedCall(lambda: _Output(cuda_log, 0), torch.device("cuda", 0), warmup=0)
    first()
    del first  # a decode call's graph is gone when the next call captures; the device keeps it for its pool
    second = GraphedCall(lambda: _Output(cuda_log, 1), torch.device("cuda", 0), warmup=0)
    second()
    third = GraphedCall(lambda: _Output(cuda_log, 2), torch.device("cuda", 0), warmup=0)
    third()
    pools = [e[1] for e in cuda_log if e[0] == "capture_begin"]
    assert pools[0] is None and pools[1] == pools[2] is not None  # the first capture makes the pool, later ones join
    assert fast_decode_step._device_graphs(0).last is third.graph
    assert fast_decode_step._device_graphs.cache_info().currsize == 1


def test_capture_ends_when_the_step_raises(cuda_log):
    def broken():
        raise RuntimeError("step failed")

    graphed = GraphedCall(broken, torch.device("cuda", 0), warmup=0)
    with pytest.raises(RuntimeError, match="step failed"):
        graphed()
    assert ("capture_end",) in cuda_log
    assert graphed.graph is None
