"""The docs are code: README.md's python examples run (on the tiny checkpoint), and every `sa2va-rl` command and
repository path that README.md and docs/*.md name exists."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from projects.llava_sam2.rl_train.cli.main import COMMANDS

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def test_readme_python_examples_run_on_the_tiny_checkpoint(tmp_path, monkeypatch):
    from projects.llava_sam2.rl_train.cli.setup_checkpoint import make_tiny_checkpoint
    from projects.llava_sam2.rl_train.data.shapes import ShapesWorld

    blocks = python_blocks((REPO / "README.md").read_text())
    assert blocks, "README.md has no ```python example"
    checkpoint = make_tiny_checkpoint(tmp_path / "Sa2VA-4B", seed=0)
    ShapesWorld("val", 1, seed=0, image_size=64)[0].image.save(tmp_path / "image.jpg")
    monkeypatch.chdir(tmp_path)  # the example's relative paths: ./pretrained/..., image.jpg
    (tmp_path / "pretrained").mkdir()
    (tmp_path / "pretrained" / "Sa2VA-4B").symlink_to(checkpoint)
    for number, block in enumerate(blocks, 1):
        if "read_base()" in block:
            continue  # an MMEngine config file shown as an example, not a script: test_configs_build builds ours
        code = block.replace('device="cuda"', 'device="cpu"')  # the tests run on CPU
        namespace = {"__name__": f"readme_example_{number}"}
        exec(compile(code, f"README.md python example {number}", "exec"), namespace)
        if "answer" in namespace:  # the inference example: a text answer and one mask per [SEG]
            assert isinstance(namespace["answer"]["prediction"], str)
            assert len(namespace["answer"]["prediction_masks"]) == namespace["answer"]["prediction"].count("[SEG]")
        if "clip_answer" in namespace:  # the video example: one [T, H, W] masklet per fed-back [SEG]
            clip, frames = namespace["clip_answer"], namespace["frames"]
            assert all(m.shape == (len(frames), frames[0].height, frames[0].width) for m in clip["prediction_masks"])
            assert len(clip["prediction_masks"]) <= clip["prediction"].count("[SEG]")


def named_commands(text: str) -> set[tuple[str, str]]:
    """Every (NAME, next word or '') of `sa2va-rl NAME ...` (or `-m projects.llava_sam2.rl_train.cli NAME ...`)."""
    return set(re.findall(r"(?:sa2va-rl|rl_train\.cli) ([a-z][\w-]*)(?: ([a-z][\w-]*))?", text))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_name_only_commands_that_exist(doc):
    for name, sub in sorted(named_commands(doc.read_text())):
        assert name in COMMANDS, f"{doc.name}: `sa2va-rl {name}` is not a command ({sorted(COMMANDS)})"
        table = getattr(importlib.import_module(COMMANDS[name][0]), "COMMANDS", None)  # a group's sub-commands
        if table is not None and sub:
            assert sub in table, f"{doc.name}: `sa2va-rl {name} {sub}` does not exist ({sorted(table)})"


# Files of the user's Sa2VA checkout that the docs name: upstream's launcher, codebase v2's converters and fine-tuning
# guide, and the RL config the user writes beside upstream's configs.
USER_CHECKOUT_FILES = {"tools/dist.sh", "tools/convert_to_hf.py", "tools/convert_to_pth.py", "docs/finetune.md",
                       "projects/llava_sam2/configs/rl/sa2va_4b_rl.py"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_name_only_files_that_exist(doc):
    ours = r"(?:tools|tests|docs|projects/llava_sam2/rl_train|projects/llava_sam2/configs/rl)/"  # not upstream's
    paths = re.findall(rf"(?<![\w/.])({ours}[\w/.-]*\w\.(?:py|sh|md|json))", doc.read_text())
    missing = sorted({p for p in paths if not (REPO / p).exists() and p not in USER_CHECKOUT_FILES})
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


def test_readme_command_table_lists_every_command():
    rows = re.findall(r"^\| (`[^|]+`) \|", (REPO / "README.md").read_text(), re.M)
    listed = {name for row in rows for name in re.findall(r"`([a-z][\w-]*)`", row)}
    assert listed == set(COMMANDS), f"README's command table {sorted(listed)} != cli/main.py {sorted(COMMANDS)}"
