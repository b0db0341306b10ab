"""`sa2va-rl check gpu` (cli/check.py): its CPU mode runs the real launches (tiny config, the judge stub server) and
judges them; its comparison of a resumed run can fail."""
from __future__ import annotations

import json
import math
import os
import sys
import subprocess
from pathlib import Path

from projects.llava_sam2.rl_train.cli.check import compare_resumed, logged_scalars

REPO = Path(__file__).resolve().parents[1]


def test_cpu_check_trains_resumes_exactly_and_writes_its_table(tmp_path):
    work = tmp_path / "check"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "projects.llava_sam2.rl_train.cli", "check", "gpu", "--cpu",
                           "--only", "single,resume", "--iters", "2", "--work-dir", str(work)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((work / "check.json").read_text())
    rows = {row["check"]: row for row in result["rows"]}
    assert set(rows) == {"single", "resume_single"} and all(row["ok"] for row in rows.values())
    assert rows["single"]["iterations"] == 2 and rows["resume_single"]["max_rel_diff"] == 0.0
    full = logged_scalars(work / "single")
    # the stub judge's varied answers give non-constant rewards, so the compared steps carry real gradients (the loss
    # itself is 0 here: equal-length captions and ratio 1 make the group-normalised policy term sum to zero)
    assert max(row["grad_norm"] for row in full.values()) > 0
    assert "resume_single" in proc.stdout and "yes" in proc.stdout  # the printed table


def test_a_resumed_run_that_drifts_or_stops_early_fails():
    full = {it: {"loss": 0.5 + it, "grad_norm": 1.0} for it in range(1, 11)}
    assert compare_resumed(full, dict(full), range(6, 11), rel=0.0) == (True, 0.0, "")
    drifted = {it: dict(row) for it, row in full.items()}
    drifted[8]["loss"] *= 1.001
    ok, worst, problem = compare_resumed(full, drifted, range(6, 11), rel=1e-4)
    assert not ok and math.isclose(worst, 1 - 1 / 1.001, rel_tol=1e-6) and "loss at iteration 8" in problem
    assert compare_resumed(full, drifted, range(6, 11), rel=1e-2)[0]
    short = {it: row for it, row in full.items() if it < 9}
    assert compare_resumed(full, short, range(6, 11), rel=1.0)[0] is False
