"""research/pretrain_summary.py: what a side-by-side pretraining call brings back and prints."""
from __future__ import annotations

import json
import tarfile

from research import pretrain_summary


def test_packs_logs_and_weights_and_names_a_run_that_died(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    log = {"stages": [{"name": "joint", "steps_done": 5, "planned_steps": 5}], "train_seconds": 1.5,
           "wall_seconds": 2.0, "held_out": {"text_dependence": {"gap": {"value": 0.3621}, "num_scenes": 200},
                                             "tasks": {"res": {"gIoU": {"value": 0.5734}}}}}
    (tmp_path / "runs/good").mkdir(parents=True)
    (tmp_path / "runs/good/pretrain_log.json").write_text(json.dumps(log))
    (tmp_path / "runs/good/model.safetensors").write_bytes(b"weights")
    (tmp_path / "runs/dead").mkdir()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs/dead.log").write_text("Traceback ...")
    out = tmp_path / "out"
    out.mkdir()

    assert pretrain_summary.main(["--out", str(out), "good", "dead"]) == 0

    with tarfile.open(out / "ckpt_good.tar") as tar:
        assert tar.getnames() == ["good", "good/model.safetensors"]  # weights without the log
    with tarfile.open(out / "logs.tgz") as tar:
        assert {"logs/good.json", "logs/dead.log"} <= set(tar.getnames())
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("logs/good.json joint:5/5 train_s 1.5 wall_s 2.0 {'gap': 0.362}")
    assert "'res': {'gIoU': 0.573}" in printed[0]
    assert printed[1].startswith("dead: no pretrain_log.json")
