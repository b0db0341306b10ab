"""tools/train.py under an interpreter without the training stack: a clear message and exit code 2.

This is the guard for the documented launch paths. `.venv/bin/xtuner train` in a shell without the venv activated
runs the system `python` (xtuner's CLI calls bare `python` from PATH) and exits 0; none of our code runs in either
process there, so the README points users at tools/train.py, which always runs in its own interpreter."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_train_without_the_stack_says_which_interpreter_and_fails():
    # -S: no site-packages, as the system python of a machine where only the venv has the stack
    out = subprocess.run([sys.executable, "-S", "tools/train.py", "projects/llava_sam2/configs/rl/tiny_sft_cpu.py"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, (out.returncode, out.stderr[-500:])
    assert f"{sys.executable} cannot import ['torch', 'mmengine', 'xtuner']" in out.stderr
    assert ".venv/bin/python tools/train.py" in out.stderr and "Traceback" not in out.stderr
