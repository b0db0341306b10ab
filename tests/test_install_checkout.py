"""Installing into a Sa2VA checkout: every import of the package is a declared requirement, and
the plugin installs (wheel into a folder, and editable) beside upstream's packages, both importable (PEP 420: no
``__init__.py`` in ``projects/`` or ``projects/llava_sam2/``): the first release's ``projects/llava_sam2/{models,
datasets}`` and codebase v2's ``projects/sa2va/{models,datasets}`` (which has no ``projects/llava_sam2/`` and no
``__init__.py`` in ``projects/`` or ``projects/sa2va/``). Offline: pip builds with
``--no-index --no-build-isolation --no-deps``."""
from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "projects/llava_sam2/rl_train"
# files that may import an extra's distributions at module level (elsewhere only inside functions)
EXTRA_FILES = {"prompt_rl": ("prompt_rl/",), "meteor_jar": ("rewards/meteor_jar.py",), "deepspeed": ()}


def _setup_lists() -> tuple[list[str], dict[str, list[str]]]:
    """install_requires and EXTRAS of setup.py, read as literals."""
    tree = ast.parse((REPO / "setup.py").read_text())
    extras = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", "") == "EXTRAS"), {})
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    requires = next(ast.literal_eval(k.value) for k in call.keywords if k.arg == "install_requires")
    return requires, extras


def _dist(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imports(file: Path) -> list[tuple[str, bool]]:
    """(top-level module name, imported at module level) for every absolute import of ``file``."""
    tree = ast.parse(file.read_text())
    module_level = {id(n) for stmt in tree.body for n in ast.walk(stmt)
                    if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    out = []
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
        out += [(name.split(".")[0], id(node) in module_level) for name in names]
    return out


def test_every_import_is_a_declared_requirement():
    requires, extras = _setup_lists()
    core = {_dist(r) for r in requires}
    extra_of = {_dist(r): name for name, reqs in extras.items() if name != "all" for r in reqs}
    known = importlib.metadata.packages_distributions()
    undeclared, misplaced = [], []
    for file in sorted(PACKAGE.rglob("*.py")):
        rel = file.relative_to(PACKAGE).as_posix()
        for module, at_module_level in _imports(file):
            if module in sys.stdlib_module_names or module in ("projects", "__future__"):
                continue
            dists = {d.lower().replace("_", "-") for d in known.get(module, [module])}
            if not dists & (core | set(extra_of)):
                undeclared.append(f"{rel}: import {module} (distribution {sorted(dists)})")
            elif not dists & core and at_module_level:
                extra = extra_of[next(iter(dists & set(extra_of)))]
                if not rel.startswith(EXTRA_FILES[extra]):
                    misplaced.append(f"{rel}: module-level import {module} of extra {extra!r}")
    assert not undeclared, "add to install_requires (or an extra) in setup.py:\n" + "\n".join(undeclared)
    assert not misplaced, "import optional packages inside functions, or list the file in EXTRA_FILES:\n" + \
        "\n".join(misplaced)
    assert set(extras) == {"prompt_rl", "meteor_jar", "deepspeed", "logging"}


# where each upstream codebase keeps its packages (no __init__.py in projects/ or in that folder)
UPSTREAM_PROJECT = {"v1": "llava_sam2", "v2": "sa2va"}


def _fake_checkout(root: Path, codebase: str) -> Path:
    """Upstream's layout: packages models/ and datasets/ under projects/<UPSTREAM_PROJECT[codebase]>/."""
    for package in ("models", "datasets"):
        folder = root / "projects" / UPSTREAM_PROJECT[codebase] / package
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text(f"NAME = 'upstream {package}'\n")
    return root


def _plugin_source(root: Path) -> Path:
    """setup.py and the package, copied so pip's in-tree build leaves the repository untouched."""
    root.mkdir(parents=True)
    shutil.copy(REPO / "setup.py", root / "setup.py")
    shutil.copytree(PACKAGE, root / "projects/llava_sam2/rl_train", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _pip(*args: str) -> None:
    # --ignore-installed: with --prefix pip would otherwise uninstall this environment's own sa2va-rl first
    result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                             "--no-build-isolation", "--ignore-installed", *args], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


IMPORT_BOTH = (
    "import projects, projects.{upstream}.models as m, projects.{upstream}.datasets as d, "
    "projects.llava_sam2.rl_train as r, projects.llava_sam2.rl_train.cli.convert as c; "
    "print(m.NAME, d.NAME, r.__version__, r.__file__, c.__file__, sep='|')"
)


# both install modes in a first-release checkout; codebase v2 differs only in where upstream's packages sit, so one
# mode covers it (each pip install costs seconds of `make test`)
@pytest.mark.parametrize("mode, codebase", [("wheel", "v1"), ("editable", "v1"), ("editable", "v2")])
def test_installs_beside_upstream_packages(tmp_path, mode, codebase):
    checkout = _fake_checkout(tmp_path / "Sa2VA", codebase)
    source = _plugin_source(tmp_path / "sa2va-rl")
    if mode == "wheel":
        _pip("--target", str(tmp_path / "site"), str(source))
        site_dir = tmp_path / "site"
        setup_site = f"import sys; sys.path.append({str(site_dir)!r})"
    else:
        _pip("--prefix", str(tmp_path / "prefix"), "-e", str(source))
        site_dir = next((tmp_path / "prefix").glob("lib/python*/site-packages"))
        setup_site = f"import site; site.addsitedir({str(site_dir)!r})"
    # -S: no site-packages of this interpreter (whose own editable install of the repo must not answer)
    import_both = IMPORT_BOTH.format(upstream=UPSTREAM_PROJECT[codebase])
    result = subprocess.run([sys.executable, "-S", "-c", f"{setup_site}; {import_both}"], cwd=checkout,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    models, datasets, version, plugin, cli = result.stdout.strip().split("|")
    assert (models, datasets, version) == ("upstream models", "upstream datasets", "0.1.0")
    plugin_root = site_dir if mode == "wheel" else source
    assert Path(plugin).is_relative_to(plugin_root) and Path(cli).is_relative_to(plugin_root)
    assert importlib.metadata.distribution("sa2va-rl").version == "0.1.0", "the test uninstalled our own install"
    if mode == "wheel":  # every module ships, those of nested sub-packages (model/network/, ...) included
        installed = site_dir / "projects/llava_sam2/rl_train"
        assert {p.relative_to(installed) for p in installed.rglob("*.py")} == \
            {p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    assert not (site_dir / "projects/__init__.py").exists()
    assert not (site_dir / "projects/llava_sam2/__init__.py").exists()
    if mode == "wheel":
        metadata = next(site_dir.glob("sa2va_rl-*.dist-info")) / "METADATA"
        requires = metadata.read_text()
        for name in ("pyarrow", "matplotlib", "scipy", "tqdm", "Pillow", "gymnasium; extra == \"prompt-rl\"",
                     "pycocoevalcap==1.2; extra == \"meteor-jar\""):
            assert f"Requires-Dist: {name}" in requires, name
        assert (site_dir / "projects/llava_sam2/rl_train/assets/tiny_tokenizer/tokenizer.json").is_file()
