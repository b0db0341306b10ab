"""engine/compat.py's CPU thread default: 1 intra-op thread per CPU process unless the user set OMP_NUM_THREADS."""
import os
import subprocess
import sys

import torch

from projects.llava_sam2.rl_train.engine.compat import set_cpu_threads

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_set_cpu_threads_keeps_the_users_choice(monkeypatch):
    threads = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        torch.set_num_threads(2)
        assert set_cpu_threads() == 2 and torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"
        monkeypatch.delenv("OMP_NUM_THREADS")
        monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
        assert set_cpu_threads() == 1 and torch.get_num_threads() == 1
        assert (os.environ["OMP_NUM_THREADS"], os.environ["MKL_NUM_THREADS"]) == ("1", "1")  # for child processes
    finally:
        torch.set_num_threads(threads)


def test_cpu_launch_defaults_to_one_thread():
    # what tools/train.py does on a CPU machine, in a fresh process with OMP_NUM_THREADS unset
    probe = ("import os, torch; from projects.llava_sam2.rl_train.engine.compat import apply_cpu_compat; "
             "assert apply_cpu_compat(); print(torch.get_num_threads(), os.environ.get('OMP_NUM_THREADS'))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU run even on a GPU machine
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == "1 1"
