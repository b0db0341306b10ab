"""The repository explains itself: no file outside research/ cites a document that does not ship with it, and the
installed package neither contains nor imports the research area (docs/architecture.md, "Layout")."""
from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest
import setuptools

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "projects/llava_sam2/rl_train"
# Folders that are not the product's files: research (its own log may cite anything), VCS, caches and run outputs.
SKIPPED_DIRS = {"research", ".git", ".venv", ".cache", "work_dirs", "__pycache__", "build", "dist", "node_modules"}
SKIPPED_SUFFIXES = {".safetensors", ".pth", ".pt", ".bin", ".png", ".jpg", ".jpeg", ".gz", ".tgz", ".tar", ".zip",
                    ".arrow", ".parquet", ".npy", ".npz", ".whl", ".pyc"}
# Each pattern names a document kept outside the repository (written in pieces so this file does not match itself).
OUTSIDE_CITES = {
    "the shared folder": re.compile(r"\.\./" + "shared" + r"\b|/work/" + "shared" + r"\b"),
    "a reference/*.md file": re.compile("reference" + r"/[\w.-]+\.md\b"),
    "the environment facts file": re.compile("environment" + r"\.md\b"),
    "the design map": re.compile("DESIGN" + r"(\.md\b| §)"),
    "the style guide": re.compile("STYLE" + r"\.md\b"),
}
LAB_PACKAGES = ("research", "tools.experiments")


def _repository_text_files() -> list[Path]:
    files = []
    for folder, dirs, names in os.walk(ROOT):  # pruned walk: never descends into .venv or run outputs
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")
                         and (d == ".ci" or not d.startswith(".")))  # .venv, .cache and other local state
        files += [Path(folder, name) for name in sorted(names) if Path(name).suffix.lower() not in SKIPPED_SUFFIXES]
    return files


def outside_cites(files: list[Path], root: Path = ROOT) -> list[str]:
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary or unreadable: not documentation
        for line_no, line in enumerate(text.splitlines(), 1):
            for what, pattern in OUTSIDE_CITES.items():
                if pattern.search(line):
                    found.append(f"{path.relative_to(root)}:{line_no}: cites {what}: {line.strip()[:100]}")
    return found


def lab_imports(source: str) -> list[str]:
    """Imports of the research area in one module: import statements and module names in strings (the CLI imports
    its commands by name)."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        hits += [f"line {node.lineno}: {name}" for name in names
                 if any(name == lab or name.startswith(lab + ".") for lab in LAB_PACKAGES)]
    return hits


def test_no_file_outside_research_cites_a_document_that_is_not_in_the_repository():
    files = _repository_text_files()
    assert any(path.name == "architecture.md" for path in files)  # the walk reaches docs/
    found = outside_cites(files)
    assert not found, "write the rationale into docs/ and cite that instead:\n" + "\n".join(found)


def test_the_cite_check_catches_each_kind_of_outside_cite(tmp_path):
    lines = ["# see ../" + "shared/x", "(reference" + "/sa2va.md §4.3)", "(environment" + ".md fact 18)",
             "DESIGN" + " §3", "the map: DESIGN" + ".md", "STYLE" + ".md rules", "docs/sa2va_internals.md §4.3"]
    for index, line in enumerate(lines):
        (tmp_path / f"f{index}.py").write_text(line + "\n")
    found = outside_cites(sorted(tmp_path.iterdir()), root=tmp_path)
    assert len(found) == len(lines) - 1 and not any("f6.py" in hit for hit in found)


def test_installed_package_holds_no_research_code():
    captured = {}
    setup_py = ROOT / "setup.py"
    original = setuptools.setup
    setuptools.setup = lambda **kwargs: captured.update(kwargs)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(ROOT)
            exec(compile(setup_py.read_text(), str(setup_py), "exec"), {"__name__": "__main__"})
    finally:
        setuptools.setup = original
    packages = captured["packages"]
    assert "projects.llava_sam2.rl_train" in packages and "projects.llava_sam2.rl_train.cli" in packages
    assert not [name for name in packages if name.split(".")[0] in ("research", "tools", "tests")]


def test_package_never_imports_the_research_area():
    modules = sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "projects/llava_sam2/configs").rglob("*.py"))
    assert len(modules) > 100
    found = [f"{path.relative_to(ROOT)} {hit}" for path in modules for hit in lab_imports(path.read_text())]
    assert not found, "the package must not depend on research/:\n" + "\n".join(found)
    assert lab_imports("from research import probe\nimport tools.experiments.x\nrun('research.sweep')\n") == [
        "line 1: research", "line 2: tools.experiments.x", "line 3: research.sweep"]


# The lab's history (which issue, session or lent machine produced a figure) belongs in research/LOG.md.
LAB_HISTORY = re.compile(r"(?<![\w/#])#\d+\b|\bissues? #?\d+|\bsessions? \d+\b|\blent (?:machine|GPU|H100|H200|host)\b"
                         r"|\bthe lead\b", re.IGNORECASE)


def lab_history(text: str) -> list[str]:
    return [f"{line_no}: {line.strip()[:100]}" for line_no, line in enumerate(text.splitlines(), 1)
            if LAB_HISTORY.search(line)]


def test_user_docs_describe_the_product_not_the_lab_history():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(PACKAGE.glob("assets/*/BUILD.md"))]
    found = [f"{path.relative_to(ROOT)}:{hit}" for path in docs for hit in lab_history(path.read_text())]
    assert not found, "move the history to research/LOG.md:\n" + "\n".join(found)
    assert lab_history("as issue #12 asked\nsession 5 measured\non the lent machine\n") == [
        "1: as issue #12 asked", "2: session 5 measured", "3: on the lent machine"]
    assert not lab_history("sample coco/12#7 and a ## heading, 6 sessions of work")


def numbered_sections(markdown: str) -> set[str]:
    """'1', '1.7', ... from `## 1. Title` / `### 1.7 Title` headings, plus 'N.k' for the k-th numbered item of `## N`."""
    sections, current = set(), None
    for line in markdown.splitlines():
        heading = re.match(r"#{2,3} (\d+(?:\.\d+)?)\.? ", line)
        if heading:
            sections.add(heading.group(1))
            current = heading.group(1) if "." not in heading.group(1) else None
        elif current and (item := re.match(r"(\d+)\. ", line)):
            sections.add(f"{current}.{item.group(1)}")
    return sections


def test_every_cited_section_of_the_internals_and_stack_pages_exists():
    cite = re.compile(r"(sa2va_internals|stack)\.md((?:[ ,]*(?:and )?§\d+(?:\.\d+)?(?:-§\d+(?:\.\d+)?)?)+)")
    pages = {name: numbered_sections((ROOT / "docs" / f"{name}.md").read_text()) for name in ("sa2va_internals", "stack")}
    missing, count = [], 0
    for path in _repository_text_files():
        if path.suffix not in (".py", ".md", ".sh", ".txt") and path.name != "Makefile":
            continue
        for match in cite.finditer(path.read_text(encoding="utf-8", errors="replace")):
            for number in re.findall(r"§(\d+(?:\.\d+)?)", match.group(2)):
                count += 1
                if number not in pages[match.group(1)]:
                    missing.append(f"{path.relative_to(ROOT)}: {match.group(1)}.md §{number}")
    assert count > 30 and not missing, missing
    assert {"1.7", "8", "8.3", "7.3"} <= pages["sa2va_internals"] and "8.6" not in pages["sa2va_internals"]
