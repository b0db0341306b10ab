"""The product tests' deterministic CPU settings (seeds, one torch thread per worker) for the research tests."""
from tests.conftest import _seed_everything  # noqa: F401  (an autouse fixture: importing it enables it here)
