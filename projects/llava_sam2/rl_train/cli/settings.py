"""Command-line flags from a settings dataclass, CleanRL ``Args`` style: the string under each field is its ``--help``.

    @dataclass
    class Settings:
        seed: int = 0
        \"\"\"training seed.\"\"\"

    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, Settings)          # --seed SEED  training seed. (default: 0)
    settings = settings_from_args(Settings, parser.parse_args(argv))

Field types map to flags: ``bool`` -> ``--x`` / ``--no-x``, ``list[T]`` / ``tuple[T, ...]`` -> ``--x V [V ...]``,
anything else (``int``, ``float``, ``str``, ``Path``) -> ``--x V`` converted by the type. A field without a default
is required.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import typing
from typing import Any


def field_docs(cls: type) -> dict[str, str]:
    """The string literal written under each field of dataclass ``cls`` (and of its dataclass bases), by name."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def add_settings_arguments(parser: argparse.ArgumentParser, cls: type, *, skip: tuple[str, ...] = ()) -> None:
    """Add one ``--flag`` per field of dataclass ``cls`` (except ``skip``): default from the field, help from its
    docstring (:func:`field_docs`). A field without a docstring raises, so every flag is documented."""
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        if field.name not in docs:
            raise TypeError(f"{cls.__name__}.{field.name} has no docstring; write one under the field (it is the "
                            "flag's --help).")
        flag, kind, default = "--" + field.name.replace("_", "-"), hints[field.name], _default(field)
        help_text = docs[field.name].replace("``", "").replace("%", "%%")
        options: dict[str, Any] = {"dest": field.name}
        if default is dataclasses.MISSING:
            options["required"] = True
        else:
            options["default"] = default
            help_text += " (default: %(default)s)"
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is list:
            (item,) = typing.get_args(kind)
            options.update(nargs="+", type=item, metavar=field.name.upper())
        elif typing.get_origin(kind) is tuple:  # tuple[T, ...]: values as for a list; the dataclass gets a tuple
            item, *rest = typing.get_args(kind)
            if rest != [Ellipsis]:
                raise TypeError(f"{cls.__name__}.{field.name}: {kind} is not supported; use tuple[T, ...] or list[T].")
            options.update(nargs="+", type=item, metavar=field.name.upper())
        else:
            options["type"] = kind
        parser.add_argument(flag, help=help_text, **options)


def settings_from_args(cls: type, args: argparse.Namespace, **given: Any) -> Any:
    """``cls`` from the parsed flags of :func:`add_settings_arguments`; ``given`` fills the skipped fields."""
    hints = typing.get_type_hints(cls)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name not in given}
    for name, value in values.items():
        if typing.get_origin(hints[name]) is tuple and isinstance(value, list):
            values[name] = tuple(value)
    return cls(**values, **given)
