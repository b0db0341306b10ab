"""`make test`'s pytest arguments keep the collection order when they hand files to the workers, so the longest files
that tests/conftest.py puts first start first. pytest-xdist's `--dist loadfile` sorts files by their number of tests
unless told `--no-loadscope-reorder`, which put the two-test demo and `check gpu` files 90th and 91st of 98."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# a conftest like the project's: the one-test files first, in this order
ORDERING_CONFTEST = '''
FIRST = ("test_long_a.py", "test_long_b.py")

def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
'''
# each test records (worker, file) as it starts
RECORDING_TEST = '''
import os

def test_{i}():
    with open(os.environ["START_LOG"], "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + " " + __file__.rsplit("/", 1)[-1] + "\\n")
'''


def make_test_pytest_args() -> list[str]:
    text = (REPO / "Makefile").read_text()
    return shlex.split(re.search(r"^PYTEST_ARGS \?= (.*)$", text, re.M).group(1))


def test_make_test_workers_start_with_the_files_the_conftest_puts_first(tmp_path):
    args = make_test_pytest_args()
    assert {"-n", "--dist"} <= set(args) and args[args.index("--dist") + 1] == "loadfile"
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(ORDERING_CONFTEST)
    for name, count in (("test_many", 6), ("test_long_a", 1), ("test_long_b", 1)):
        (suite / f"{name}.py").write_text("".join(RECORDING_TEST.format(i=i) for i in range(count)))
    log = tmp_path / "starts.txt"
    proc = subprocess.run([sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider", "--rootdir", str(suite),
                           str(suite)], cwd=suite, env={**_clean_env(), "START_LOG": str(log)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    first_file_of_worker = {}
    for line in log.read_text().splitlines():
        worker, name = line.split()
        first_file_of_worker.setdefault(worker, name)
    # the two one-test files went out first, one to each worker; the six-test file waited
    assert sorted(first_file_of_worker.values()) == ["test_long_a.py", "test_long_b.py"], first_file_of_worker


def _clean_env() -> dict[str, str]:
    import os

    return {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "PYTHONPATH"))}
