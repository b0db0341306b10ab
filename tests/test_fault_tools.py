"""tests/fault_tools.py: the failure tests' children can train whatever this pytest process ran before them."""
from __future__ import annotations

import torch

from fault_tools import run_forked


def backward_once() -> None:
    x = torch.ones(3, requires_grad=True)
    (2 * x).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]


def test_children_backprop_after_this_process_compiled_a_graph():
    """A compiled graph (the merged-decode tests compile one) starts autograd's thread pool; a child forked from this
    process then cannot run backward at all, which failed every crash test after those tests in the full suite."""
    compiled = torch.compile(lambda a: (a * 2).sum(), backend="aot_eager")
    compiled(torch.ones(2, requires_grad=True)).backward()
    assert run_forked(backward_once, timeout=120) == [0]
