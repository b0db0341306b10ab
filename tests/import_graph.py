"""The package's imports read from its sources (ast), for the layering tests: nothing is imported to check it."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple


class ImportStatement(NamedTuple):
    """One imported module of an ``import`` / ``from ... import`` statement, names made absolute.

    ``source`` is the module of ``import source`` or the part after ``from``; ``names`` what follows ``import`` in a
    ``from`` statement (empty for ``import source``); ``bare`` marks ``from . import x`` (``source`` is a package and
    each name one of its modules); ``type_only`` marks an import under ``if TYPE_CHECKING:``."""

    source: str
    names: tuple[str, ...]
    bare: bool
    type_only: bool


def modules_under(root: Path, package: str) -> list[tuple[str, Path]]:
    """(dotted module name, file) of every module below ``root``, the directory of ``package``."""
    modules = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        modules.append((".".join((package, *parts)).removesuffix(".__init__"), path))
    return modules


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return inside


def import_statements(module: str, source: str, is_package: bool = False) -> list[ImportStatement]:
    """Every import of ``module`` (its source text), lazy ones inside functions included."""
    tree = ast.parse(source)
    type_only = _type_checking_nodes(tree)
    package = module if is_package else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [ImportStatement(alias.name, (), False, id(node) in type_only) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            target = ".".join(part for part in (base, node.module) if part)
            found.append(ImportStatement(target, tuple(alias.name for alias in node.names), node.module is None,
                                         id(node) in type_only))
    return found
