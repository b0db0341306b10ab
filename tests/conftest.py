"""Shared pytest settings: deterministic CPU runs."""
import os

import pytest

os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    config.addinivalue_line("markers", "demo: a long demo pipeline check, run by `make demo` instead of `make test`")


@pytest.fixture(autouse=True)
def _seed_everything():
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)  # a parallel run: one core per worker
    yield


# The files with the longest runs (multi-process launches, the shortened demo), longest first. `make test` hands whole
# files to two workers in collection order (`--dist loadfile --no-loadscope-reorder`, tests/test_make_test_schedule.py);
# starting these first keeps one of them from being the last file of a worker that the other worker finished long ago
# (longest-processing-time-first scheduling).
LONGEST_FIRST = (
    "test_demo_pipeline.py", "test_check_gpu.py", "test_engine_launch.py", "test_demo_pipeline_same_domain.py",
    "test_engine_parity.py", "test_upstream_sft.py", "test_engine_fault_points.py", "test_prompt_filter.py",
    "test_upstream_v2_sft.py",
)


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
