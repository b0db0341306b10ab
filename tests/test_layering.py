"""The package's layers import only downward, and framework internals stay in the seams modules.

Read from the sources (ast, every import counted, also one inside a function), so the check costs no heavy import.
The layer map is the one of docs/architecture.md::

    cli/, demo/, benchmarks/        the user commands, on top (nothing below imports them)
    engine/                         -> grpo/ -> model/, rewards/, data/
    prompt_rl/ -> evaluation/       -> model/, rewards/, data/   (nothing below imports prompt_rl/)
    model/, rewards/                -> data/

grpo/, model/, rewards/ and data/ never import MMEngine. Outside the files named ``*_seams.py``
(engine/mmengine_seams.py, model/network/transformers_seams.py, model/network/torch_seams.py), no module imports or reads a private
name (one leading underscore) of MMEngine, torch, DeepSpeed, transformers, peft or XTuner: neither ``from torch.x
import _y`` nor ``torch._y`` / ``nn.modules._Y`` on a name imported from them, nor a private attribute (or a
``getattr`` of one) on any other object when the package itself defines no attribute of that name
(``config._attn_implementation``). model/'s own sub-package order is tests/test_model_layering.py's. The checkers are
tested on synthetic sources below.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

import projects.llava_sam2.rl_train as rl_train
from import_graph import import_statements, modules_under

PACKAGE = rl_train.__name__  # projects.llava_sam2.rl_train
ROOT = Path(rl_train.__file__).parent
TOP = {"cli", "demo", "benchmarks"}
BELOW_TOP = {
    "data": set(),
    "rewards": {"data"},
    "model": {"data"},
    "grpo": {"model", "rewards", "data"},
    "evaluation": {"model", "rewards", "data"},
    "prompt_rl": {"evaluation", "model", "rewards", "data"},
    "engine": {"grpo", "model", "rewards", "data"},
}
# layer -> the layers it may import; the user commands may import every layer and each other
MAY_IMPORT = {**BELOW_TOP, **{top: set(BELOW_TOP) | TOP for top in TOP}}
NO_MMENGINE = {"grpo", "model", "rewards", "data"}
FRAMEWORKS = {"mmengine", "torch", "deepspeed", "transformers", "peft", "xtuner"}
# namedtuple's public methods carry a leading underscore (to leave field names free)
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_field_defaults", "_make"}


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def is_seams(path: Path) -> bool:
    return path.name.endswith("_seams.py")


def package_modules() -> list[tuple[str, Path]]:
    """(dotted module name, file) of every module of the package."""
    return modules_under(ROOT, PACKAGE)


def layer_of(module: str) -> str | None:
    """The layer (first sub-package) of a module of the package; None for the package itself."""
    rest = module.removeprefix(PACKAGE).lstrip(".")
    return rest.split(".")[0] or None


# ---- imports ------------------------------------------------------------------------------------------------------


def imported_modules(module: str, source: str, is_package: bool = False) -> list[str]:
    """Absolute name of everything ``module`` imports (``from a import b`` gives ``a.b``: b may be a module)."""
    names = []
    for stmt in import_statements(module, source, is_package):
        names += [f"{stmt.source}.{name}" for name in stmt.names] or [stmt.source]
    return names


def layer_violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """What ``module`` imports against the layer map; empty when it keeps to it."""
    own = layer_of(module)
    problems = []
    for name in imported_modules(module, source, is_package):
        if name.split(".")[0] == "mmengine" and own in NO_MMENGINE:
            problems.append(f"{module} imports {name}: {own}/ does not depend on MMEngine")
        elif name.startswith(PACKAGE + ".") and own is not None:
            target = layer_of(name)
            if target != own and target not in MAY_IMPORT.get(own, set()):
                problems.append(f"{module} imports {name}: {own}/ may import only "
                                f"{sorted(MAY_IMPORT.get(own, set()))}")
    return problems


# ---- private names of the frameworks -------------------------------------------------------------------------------


def own_private_attributes(tree: ast.AST) -> set[str]:
    """Private names a module defines for its own objects: functions, classes, variables and class fields, and
    attributes set on ``self`` / ``cls`` (also through ``setattr`` / ``object.__setattr__``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
            names.add(node.attr)
        elif isinstance(node, ast.Call) and _attribute_call(node) in ("setattr", "__setattr__") and \
                _is_self(node.args[0]) and isinstance(node.args[1], ast.Constant):
            names.add(str(node.args[1].value))
    return {name for name in names if is_private(name)}


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _attribute_call(node: ast.Call) -> str | None:
    """The name of ``getattr(obj, "name", ...)``-like calls (also ``object.__setattr__``) that have two args."""
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name in ("getattr", "setattr", "hasattr", "delattr", "__setattr__", "__getattribute__") and len(node.args) >= 2:
        return name
    return None


def _imported_names(tree: ast.AST) -> dict[str, str]:
    """Local name -> the module or object it is bound to by an import."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:  # `import a.b` binds a; `import a.b as c` binds c to a.b
                top = alias.name.split(".")[0]
                names[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def private_uses(module: str, source: str, own_private: set[str]) -> list[str]:
    """Private framework names ``module`` imports or reads (module docstring); ``own_private``: the private
    attribute names the package defines for its own objects."""
    tree = ast.parse(source)
    imported = _imported_names(tree)

    def is_framework(dotted: str) -> bool:
        return dotted.split(".")[0] in FRAMEWORKS

    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_framework(alias.name) and any(is_private(part) for part in alias.name.split(".")):
                    problems.append(f"{module}: import {alias.name} (a private module)")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level and is_framework(node.module):
            parts = node.module.split(".") + [alias.name for alias in node.names]
            for part in filter(is_private, parts):
                problems.append(f"{module}: from {node.module} import ... reads the private name {part}")
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            root = _root(node)
            where = f"{module}:{node.lineno}: {ast.unparse(node)}"
            if isinstance(root, ast.Name) and root.id in imported:
                if is_framework(imported[root.id]):
                    problems.append(f"{where} (a private name of {imported[root.id].split('.')[0]})")
            elif not _is_self(node.value) and node.attr not in own_private | NAMEDTUPLE_API:
                problems.append(f"{where} (a private attribute the package does not define)")
        elif isinstance(node, ast.Call) and _attribute_call(node) and isinstance(node.args[1], ast.Constant):
            name = node.args[1].value
            if isinstance(name, str) and is_private(name) and not _is_self(node.args[0]) and \
                    name not in own_private | NAMEDTUPLE_API:
                problems.append(f"{module}:{node.lineno}: {ast.unparse(node)} (a private attribute the package "
                                "does not define)")
    return problems


def package_private_attributes() -> set[str]:
    return set().union(*(own_private_attributes(ast.parse(path.read_text())) for _, path in package_modules()))


# ---- the package ---------------------------------------------------------------------------------------------------


def test_every_layer_is_placed_in_the_map():
    layers = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert layers == set(MAY_IMPORT), (f"layers not in the map: {sorted(layers - set(MAY_IMPORT))}; place each in "
                                       "MAY_IMPORT (and docs/architecture.md)")
    for layer, below in BELOW_TOP.items():  # an order: no two layers import each other
        assert not (TOP & below) and all(layer not in BELOW_TOP[other] for other in below), layer


def test_layers_import_only_downward():
    problems = [problem for module, path in package_modules()
                for problem in layer_violations(module, path.read_text(), path.name == "__init__.py")]
    assert not problems, "\n".join(problems)


def test_framework_internals_only_in_the_seams_modules():
    own = package_private_attributes()
    problems = [problem for module, path in package_modules() if not is_seams(path)
                for problem in private_uses(module, path.read_text(), own)]
    assert not problems, ("private framework names outside the *_seams.py modules (move each behind a seam with "
                          "a canary test, or use public API):\n" + "\n".join(problems))


def test_modules_outside_model_import_without_a_circle():
    """No import circle among the modules (model/'s inside is ordered by tests/test_model_layering.py)."""
    modules = dict(package_modules())
    edges = defaultdict(set)
    for module, path in modules.items():
        for name in imported_modules(module, path.read_text(), path.name == "__init__.py"):
            target = name if name in modules else name.rsplit(".", 1)[0]
            if target in modules and target != module and layer_of(module) != "model":
                edges[module].add(target)
    assert not find_cycle(edges), " -> ".join(find_cycle(edges))


def find_cycle(edges: dict[str, set[str]]) -> list[str]:
    """One import circle of ``edges`` (first module repeated at its end), or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return []

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            return cycle
    return []


# ---- the checkers, on synthetic sources ----------------------------------------------------------------------------


@pytest.mark.parametrize("module, source, expected", [
    (f"{PACKAGE}.grpo.trainer", "from ..model.sa2va import Sa2VAModel\nfrom ..rewards import IoUReward\n", []),
    (f"{PACKAGE}.grpo.trainer", "from ..engine.loop import GRPOLoop\n",
     ["grpo.trainer imports " + PACKAGE + ".engine"]),
    (f"{PACKAGE}.grpo.trainer", "def f():\n    from ..engine import loop\n",  # a lazy import counts
     ["grpo.trainer imports " + PACKAGE + ".engine.loop"]),
    (f"{PACKAGE}.grpo.trainer", "from mmengine.registry import MODELS\n", ["grpo/ does not depend on MMEngine"]),
    (f"{PACKAGE}.model.sa2va", "import mmengine\n", ["model/ does not depend on MMEngine"]),
    (f"{PACKAGE}.engine.loop", "from mmengine.runner import IterBasedTrainLoop\nfrom ..grpo import trainer\n", []),
    (f"{PACKAGE}.engine.loop", f"from {PACKAGE}.prompt_rl import reward\n", ["engine.loop imports"]),
    (f"{PACKAGE}.evaluation.tasks", "from ..prompt_rl.segment import upsample\n", ["evaluation.tasks imports"]),
    (f"{PACKAGE}.prompt_rl.segment", "from ..evaluation.tasks import run_task\n", []),
    (f"{PACKAGE}.model.tokenizer", "from ..data.types import RegionSample\n", []),
    (f"{PACKAGE}.data.coco", "from ..model.processor import Sa2VAProcessor\n", ["data/ may import only []"]),
    (f"{PACKAGE}.rewards.iou", "from .. import cli\n", ["rewards.iou imports " + PACKAGE + ".cli"]),
    (f"{PACKAGE}.engine.builders", "from ..demo.pipeline import DemoSettings\n", ["engine.builders imports"]),
    (f"{PACKAGE}.demo.controls", "from ..cli.settings import settings_from_args\nfrom ..engine import loop\n", []),
    (f"{PACKAGE}.data", "from .coco import CocoRegionDataset\n", []),  # a package's own modules
])
def test_layer_checker(module, source, expected):
    found = layer_violations(module, source, is_package=module.endswith(".data"))
    assert len(found) == len(expected) and all(want in got for want, got in zip(expected, found)), found


@pytest.mark.parametrize("source, expected", [
    ("import torch\nx = torch.zeros(2)\n", []),
    ("from torch.nn.modules.dropout import _DropoutNd\n", ["private name _DropoutNd"]),
    ("from torch._dynamo import config\n", ["private name _dynamo"]),
    ("import torch._dynamo\n", ["import torch._dynamo (a private module)"]),
    ("from torch import nn\nok = isinstance(m, nn.modules.dropout._DropoutNd)\n", ["nn.modules.dropout._DropoutNd"]),
    ("import torch\ntorch._foreach_lerp_(a, b, 0.1)\n", ["torch._foreach_lerp_ (a private name of torch)"]),
    ("def f(options):\n    from mmengine.config import DictAction\n    return DictAction._parse_iterable(options)\n",
     ["DictAction._parse_iterable (a private name of mmengine)"]),
    ("def build(cfg):\n    cfg._attn_implementation = 'sdpa'\n",
     ["cfg._attn_implementation (a private attribute the package does not define)"]),
    ("def kernel(lm):\n    return lm.config._attn_implementation\n", ["lm.config._attn_implementation"]),
    ("def hooked(lm):\n    return getattr(lm, '_require_grads_hook', None)\n", ["getattr(lm, '_require_grads_hook'"]),
    # the package's own private attributes, namedtuple's API and non-framework modules are not flagged
    ("class Job:\n    def __init__(self):\n        self._index = 0\n\ndef step(job):\n    job._index += 1\n", []),
    ("def redact(parts):\n    return parts._replace(netloc='x')\n", []),
    ("import os\nos._exit(0)\n", []),
    ("class A:\n    def f(self):\n        return self._cache\n", []),
])
def test_private_name_checker(source, expected):
    found = private_uses("m", source, own_private_attributes(ast.parse(source)))
    assert len(found) == len(expected) and all(want in got for want, got in zip(expected, found)), found


def test_cycle_finder():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"y2"}, "y2": {"y"}}) == ["y", "y2", "y"]
