"""model/'s sub-packages import only downward, as each one's docstring says ("Imports: ..."), and no model module
imports the layers above model/ (grpo/, engine/, evaluation/, ...) or mmengine. Read from the sources (ast), so the
check costs no heavy import; the checker itself is tested on synthetic sources."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import projects.llava_sam2.rl_train.model as model_pkg
from import_graph import import_statements, modules_under

MODEL_DIR = Path(model_pkg.__file__).parent
PACKAGE = model_pkg.__name__  # projects.llava_sam2.rl_train.model
RL_TRAIN = PACKAGE.rsplit(".", 1)[0]
SUBPACKAGES = sorted(p.name for p in MODEL_DIR.iterdir() if (p / "__init__.py").is_file())
# model/ reads RegionSample by its fields: a type-only import of data/ is no runtime dependency.
TYPE_ONLY_OUTSIDE = {"data"}
FORBIDDEN_TOP = {"mmengine"}


def declared_imports(docstring: str) -> set[str]:
    """The sub-packages named in the docstring's ``Imports:`` sentence (up to its first '(' or '. ')."""
    match = re.search(r"^Imports:(.*?)(?:\(|\.\s|\.$)", docstring, flags=re.M | re.S)
    assert match, "no 'Imports:' sentence"
    return set(re.findall(r"``(\w+)``", match.group(1))) & set(SUBPACKAGES)


def allowed_imports() -> dict[str, set[str]]:
    return {sub: declared_imports(ast.get_docstring(ast.parse((MODEL_DIR / sub / "__init__.py").read_text())))
            for sub in SUBPACKAGES}


def imported_modules(module: str, source: str, is_package: bool = False) -> list[tuple[str, bool]]:
    """(absolute module name, type_only) for every import in ``source`` of ``module``: the module after ``from``,
    or each module of a bare ``from . import x``."""
    return [(name, stmt.type_only) for stmt in import_statements(module, source, is_package)
            for name in ([f"{stmt.source}.{n}" for n in stmt.names] if stmt.bare else [stmt.source])]


def violations(module: str, source: str, allowed: dict[str, set[str]], is_package: bool = False) -> list[str]:
    """What ``module`` (a dotted name under model/) imports against the layering; empty when it keeps to it."""
    own = module.removeprefix(PACKAGE + ".").split(".")[0]
    problems = []
    for name, type_only in imported_modules(module, source, is_package):
        if name.split(".")[0] in FORBIDDEN_TOP:
            problems.append(f"{module} imports {name}: model/ does not depend on MMEngine")
        elif name.startswith(PACKAGE + "."):
            target = name.removeprefix(PACKAGE + ".").split(".")[0]
            if target != own and target not in allowed.get(own, set()):
                problems.append(f"{module} imports {name}: {own}/ may import only {sorted(allowed.get(own, ()))}")
        elif name == PACKAGE:
            problems.append(f"{module} imports the model/ facade; import the sub-package module directly")
        elif name.startswith(RL_TRAIN + "."):
            outside = name.removeprefix(RL_TRAIN + ".").split(".")[0]
            if not (type_only and outside in TYPE_ONLY_OUTSIDE):
                problems.append(f"{module} imports {name}: model/ is below {outside}/")
    return problems


def model_modules() -> list[tuple[str, Path]]:
    return modules_under(MODEL_DIR, PACKAGE)


def test_every_model_module_lives_in_a_subpackage():
    flat = [path.name for path in MODEL_DIR.glob("*.py") if path.name != "__init__.py"]
    assert not flat, f"model/{flat}: put each module in the sub-package of its job (model/__init__.py lists them)"
    assert SUBPACKAGES == ["checkpoints", "decoding", "network", "pipeline", "sft", "text"]


def test_declared_layers_form_an_order():
    allowed = allowed_imports()
    assert allowed == {"text": set(), "network": {"text"}, "decoding": {"text", "network"},
                       "checkpoints": {"text", "network"}, "sft": {"text", "network", "decoding"},
                       "pipeline": {"text", "network", "decoding"}}
    for sub, below in allowed.items():
        for other in below:
            assert sub not in allowed[other], f"{sub} and {other} may import each other"


def test_model_modules_keep_to_the_layers():
    allowed = allowed_imports()
    problems = [problem for module, path in model_modules() if path.parent != MODEL_DIR
                for problem in violations(module, path.read_text(), allowed, path.name == "__init__.py")]
    assert not problems, "\n".join(problems)


ALLOWED = {"text": set(), "network": {"text"}, "checkpoints": {"text", "network"}}


@pytest.mark.parametrize("module, source, expected", [
    (f"{PACKAGE}.network.sa2va", "from ..text.constants import SEG_TOKEN\nimport torch\n", []),
    (f"{PACKAGE}.network.sa2va", "from ..checkpoints.hf_checkpoint import load_pretrained\n",
     ["network.sa2va imports projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint"]),
    (f"{PACKAGE}.network.sa2va", "def f():\n    from ..checkpoints import hf_checkpoint\n",  # lazy imports count
     ["network.sa2va imports projects.llava_sam2.rl_train.model.checkpoints:"]),
    (f"{PACKAGE}.text.tiling", f"from {PACKAGE}.network.grounding import logits_to_masks\n",
     ["text.tiling imports projects.llava_sam2.rl_train.model.network.grounding"]),
    (f"{PACKAGE}.checkpoints.hf_checkpoint", "from ..network.sa2va import Sa2VAModel\nfrom . import xtuner_keys\n", []),
    (f"{PACKAGE}.network.lora", "from mmengine.model import BaseModel\n", ["network.lora imports mmengine.model"]),
    (f"{PACKAGE}.network.lora", "import mmengine\n", ["network.lora imports mmengine"]),
    (f"{PACKAGE}.network.lora", "from ...grpo.trainer import CycleGRPO\n",
     ["network.lora imports projects.llava_sam2.rl_train.grpo.trainer"]),
    (f"{PACKAGE}.network.lora", "from .. import network\nfrom ... import engine\n",
     ["network.lora imports projects.llava_sam2.rl_train.engine"]),
    (f"{PACKAGE}.text.prompts", f"from {PACKAGE} import Sa2VAModel\n", ["text.prompts imports the model/ facade"]),
    (f"{PACKAGE}.text.processor", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from ...data.types import RegionSample\n", []),
    (f"{PACKAGE}.text.processor", "if TYPE_CHECKING:\n    from ...evaluation.tasks import Task\n",
     ["text.processor imports projects.llava_sam2.rl_train.evaluation.tasks"]),
    (f"{PACKAGE}.text.processor", "from ...data.types import RegionSample\n",
     ["text.processor imports projects.llava_sam2.rl_train.data.types"]),
])
def test_checker_flags_upward_and_outside_imports(module, source, expected):
    found = violations(module, source, ALLOWED)
    assert len(found) == len(expected) and all(want in got for want, got in zip(expected, found)), found


def test_declared_imports_reads_the_sentence_only():
    assert declared_imports("X.\n\nImports: ``text`` only. Weights live one layer up, in ``checkpoints``.\n") == {"text"}
    assert declared_imports("Imports: ``text``, ``network`` and ``decoding`` (below ``pipeline``).") == {
        "text", "network", "decoding"}


def test_subpackage_inits_are_light():
    """A sub-package ``__init__`` holds only its docstring, so importing model/ or any sub-package loads no torch."""
    for sub in SUBPACKAGES:
        body = ast.parse((MODEL_DIR / sub / "__init__.py").read_text()).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr), f"model/{sub}/__init__.py: docstring only"
    code = (f"import sys, {PACKAGE}; " + "; ".join(f"import {PACKAGE}.{sub}" for sub in SUBPACKAGES)
            + "; print(sorted(m for m in ('torch', 'transformers', 'sam2', 'mmengine') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_public_names_point_at_their_modules():
    """model/__init__.py's lazy table: each name is defined at the top of the module it names (read, not imported)."""
    table = ast.literal_eval(next(node.value for node in ast.parse((MODEL_DIR / "__init__.py").read_text()).body
                                  if isinstance(node, ast.Assign) and node.targets[0].id == "_EXPORTS"))
    for name, module in table.items():
        path = MODEL_DIR.joinpath(*module.lstrip(".").split(".")).with_suffix(".py")
        assert path.is_file(), f"{name}: {module} is not a module of model/"
        defined = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                defined.update(t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                               if isinstance(t, ast.Name))
        assert name in defined, f"{name} is not defined in model/{path.relative_to(MODEL_DIR)}"
