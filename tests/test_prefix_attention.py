"""model/decoding/prefix_attention.py: the shared-prefix decode attention kernels, checked on CPU in Triton's
interpreter (tests/interpreted_prefix_attention.py, in a subprocess: the interpreter is chosen when Triton is imported)
and their argument checks."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from projects.llava_sam2.rl_train.model.decoding.prefix_attention import interpreted, shared_prefix_decode_attention

TESTS = Path(__file__).parent


@pytest.mark.skipif(interpreted(), reason="this process is the interpreter's already")
def test_kernels_in_the_triton_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                             "-p", "no:randomly", str(TESTS / "interpreted_prefix_attention.py")],
                            env=env, cwd=TESTS.parent, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]


def test_cpu_tensors_outside_the_interpreter_are_refused():
    if interpreted():
        pytest.skip("the interpreter runs CPU tensors")
    q = torch.zeros(2, 4, 16)
    kv = torch.zeros(1, 2, 8, 16)
    tail = torch.zeros(2, 2, 4, 16)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        shared_prefix_decode_attention(q, kv, kv, torch.zeros(1, 8), tail, tail, torch.zeros(2, 4),
                                       torch.tensor([4]), 0.25)


@pytest.mark.parametrize("visible_tail", [torch.tensor([4.0]), torch.tensor([2, 4])])
def test_a_tail_bound_that_is_not_one_integer_on_the_device_is_refused(visible_tail):
    """The kernel reads the bound as one integer: a float or several values would be read wrongly, so the op refuses
    them before any launch."""
    q = torch.zeros(2, 4, 16)
    kv = torch.zeros(1, 2, 8, 16)
    tail = torch.zeros(2, 2, 4, 16)
    with pytest.raises(ValueError, match="visible_tail must be one integer"):
        shared_prefix_decode_attention(q, kv, kv, torch.zeros(1, 8), tail, tail, torch.zeros(2, 4), visible_tail, 0.25)


def test_prompt_lengths_of_a_run_share_few_kernel_variants():
    """The kernels are compiled per blocks-per-split (and tail blocks) value: over every bucketed prompt length up to
    8k tokens there are only a few such values, and the splits always cover the prompt."""
    from projects.llava_sam2.rl_train.model.decoding.prefix_attention import BLOCK_KEYS, prompt_splits

    seen = set()
    for L in range(64, 8193, 64):
        per_split, splits, most = prompt_splits(L, 16, torch.device("cpu"))
        assert splits <= most and (splits - 1) * per_split * BLOCK_KEYS < L <= splits * per_split * BLOCK_KEYS
        seen.add(per_split)
    assert all(p & (p - 1) == 0 for p in seen) and len(seen) <= 8  # 128 lengths, a handful of compiles


def test_the_shape_only_implementation_takes_the_same_arguments():
    """A compiled decode step traces the op through its shape-only implementation (meta tensors here): it takes the
    bound like the kernels and gives the query's shape."""
    meta = dict(device="meta")
    q = torch.empty(4, 6, 16, **meta)
    kv = torch.empty(2, 3, 8, 16, **meta)
    tail = torch.empty(4, 3, 5, 16, **meta)
    out = shared_prefix_decode_attention(q, kv, kv, torch.empty(2, 8, **meta), tail, tail, torch.empty(4, 5, **meta),
                                         torch.empty(1, dtype=torch.long, **meta), 0.25)
    assert out.shape == q.shape and out.device.type == "meta"
