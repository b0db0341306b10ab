"""Shared pytest settings: deterministic CPU runs."""
import os

import pytest

os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
