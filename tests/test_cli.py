"""The ``sa2va-rl`` command line: one table lists every user command, each command's module answers ``--help``,
flags come from documented settings, and no module of the package edits ``sys.path``."""
from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from projects.llava_sam2.rl_train.cli import main as cli
from projects.llava_sam2.rl_train.cli.settings import add_settings_arguments, field_docs, settings_from_args

REPO = Path(__file__).resolve().parents[1]


def groups() -> dict[str, dict]:
    """The commands with sub-commands: their module holds its own ``COMMANDS`` table."""
    modules = {name: importlib.import_module(module) for name, (module, _) in cli.COMMANDS.items()}
    return {name: module.COMMANDS for name, module in modules.items() if hasattr(module, "COMMANDS")}


def leaf_commands() -> list[tuple[list[str], str]]:
    """([words after sa2va-rl], module) of every command that runs something (groups expanded)."""
    tables = groups()
    out = []
    for name, (module, _) in cli.COMMANDS.items():
        if name in tables:
            out += [([name, sub], sub_module) for sub, (sub_module, _) in tables[name].items()]
        else:
            out.append(([name], module))
    return out


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    printed = capsys.readouterr().out
    assert exit_info.value.code == 0
    for name, (_, help_line) in cli.COMMANDS.items():
        assert re.search(rf"^  {re.escape(name)} +{re.escape(help_line)}$", printed, re.M), name
    assert cli.main([]) == 2  # no command: the help, and a usage-error status
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["no-such-command"])
    assert exit_info.value.code == 2 and "invalid choice: 'no-such-command'" in capsys.readouterr().err


@pytest.mark.parametrize("group", ["bench", "judge", "prompt-rl", "setup"])
def test_group_help_lists_its_commands(group, capsys):
    table = groups()[group]
    with pytest.raises(SystemExit) as exit_info:
        cli.main([group, "--help"])
    printed = capsys.readouterr().out
    assert exit_info.value.code == 0 and f"usage: sa2va-rl {group} [-h] COMMAND" in printed
    assert all(f"  {name} " in printed for name in table)


@pytest.mark.parametrize("words,module", leaf_commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_every_command_answers_help_with_its_own_name(words, module, capsys):
    assert callable(importlib.import_module(module).main), f"{module} has no main(argv)"
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*words, "--help"])
    assert exit_info.value.code == 0
    assert re.search(rf"^usage: sa2va-rl {' '.join(words)} ", capsys.readouterr().out, re.M), module


def test_train_help_describes_this_project_and_accepts_xtuners_options(capsys, monkeypatch):
    """`sa2va-rl train --help` is ours (it printed xtuner's "Train LLM" and no word of --resume auto); xtuner's parser
    still parses the arguments, so both must accept the same options."""
    import contextlib
    import io

    from xtuner.tools import train as xtuner_train

    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    ours = capsys.readouterr().out
    assert "Train LLM" not in ours and "Sa2VA-RL" in ours and "--resume auto" in ours
    monkeypatch.setattr(sys, "argv", ["xtuner", "--help"])
    with contextlib.redirect_stdout(io.StringIO()) as theirs, pytest.raises(SystemExit):
        xtuner_train.parse_args()
    options = re.compile(r"(--?[a-z][\w-]*)")
    assert set(options.findall(ours.split("options:")[1].split("examples:")[0])) == \
        set(options.findall(theirs.getvalue().split("options:")[1]))


def test_xtuner_cli_ignores_its_childs_exit_code(monkeypatch):
    """Why the docs send scripts to `sa2va-rl train` (a limitation we cannot fix here): `xtuner train` starts its child
    with the bare `python` from PATH (the system python without an activated venv: ModuleNotFoundError) and returns
    None, i.e. exit status 0, whatever the child's status. A canary: it fails when xtuner changes this."""
    import xtuner.entry_point as entry

    calls = []
    monkeypatch.setattr(entry.subprocess, "run", lambda cmd, *a, **k: calls.append(cmd) or
                        subprocess.CompletedProcess(cmd, returncode=1))
    monkeypatch.setattr(sys, "argv", ["xtuner", "train", "config.py"])
    for name in ("NNODES", "NPROC_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    assert entry.cli() is None  # the console script's sys.exit(None): status 0 although the child failed
    assert calls and calls[0][0] == "python"  # not sys.executable


def test_setup_py_declares_the_console_script():
    assert '"sa2va-rl=projects.llava_sam2.rl_train.cli.main:main"' in (REPO / "setup.py").read_text()


def test_no_module_edits_sys_path_or_loads_a_script_by_path():
    files = [*(REPO / "projects").rglob("*.py"), *(REPO / "tools").rglob("*.py")]  # experiments too
    offenders = [str(path.relative_to(REPO)) for path in files
                 if re.search(r"sys\.path\.(insert|append)|spec_from_file_location|runpy\.run_path", path.read_text())]
    assert not offenders, f"these files edit sys.path or import a script by path: {offenders}"


# upstream Sa2VA's launcher and codebase v2's converters, in the user's checkout, not in this repository
UPSTREAM_SCRIPTS = {"tools/dist.sh", "tools/convert_to_hf.py", "tools/convert_to_pth.py"}


def test_package_messages_name_only_scripts_that_exist():
    named = {(path.relative_to(REPO), m) for path in (REPO / "projects").rglob("*.py")
             for m in re.findall(r"\btools/[\w/]+\.(?:py|sh)", path.read_text())}
    missing = sorted((str(path), script) for path, script in named
                     if not (REPO / script).exists() and script not in UPSTREAM_SCRIPTS)
    assert not missing, f"messages or docstrings name scripts that do not exist: {missing}"


@dataclass
class ToySettings:
    """A settings dataclass in the CleanRL ``Args`` style."""

    out: Path
    """where to write."""
    steps: int = 10
    """optimizer steps (100% of the run)."""
    use_ema: bool = True
    """keep an EMA copy."""
    options: list[str] = field(default_factory=list)
    """extra ``key=value`` overrides."""


def test_settings_flags_come_from_the_field_docstrings(capsys):
    assert field_docs(ToySettings) == {"out": "where to write.", "steps": "optimizer steps (100% of the run).",
                                       "use_ema": "keep an EMA copy.", "options": "extra ``key=value`` overrides."}
    parser = argparse.ArgumentParser(prog="toy")
    add_settings_arguments(parser, ToySettings)
    settings = settings_from_args(ToySettings, parser.parse_args(
        ["--out", "x", "--steps", "3", "--no-use-ema", "--options", "a=1", "b=2"]))
    assert settings == ToySettings(Path("x"), 3, False, ["a=1", "b=2"])
    assert settings_from_args(ToySettings, parser.parse_args(["--out", "y"])) == ToySettings(Path("y"))
    with pytest.raises(SystemExit):
        parser.parse_args([])  # --out has no default: required
    parser.print_help()
    printed = " ".join(capsys.readouterr().out.split())
    assert "optimizer steps (100% of the run). (default: 10)" in printed
    assert "extra key=value overrides. (default: [])" in printed


def test_a_settings_field_without_docstring_is_refused():
    @dataclass
    class Undocumented:
        seed: int = 0

    with pytest.raises(TypeError, match=r"Undocumented.seed has no docstring"):
        add_settings_arguments(argparse.ArgumentParser(), Undocumented)


def test_demo_settings_parse_from_the_command_line(tmp_path):
    from projects.llava_sam2.rl_train.demo.pipeline import DemoSettings, parse_args

    settings, args = parse_args(["--work-dir", str(tmp_path), "--seed", "3", "--all-objects",
                                 "--rl-options", "a=1", "b=2", "--stop-after", "sft"])
    assert settings == DemoSettings(tmp_path, seed=3, all_objects=True, rl_options=["a=1", "b=2"])
    assert args.stop_after == "sft" and not args.force


def test_export_reads_a_work_dirs_last_checkpoint(tmp_path):
    from projects.llava_sam2.rl_train.cli.export import resolve_checkpoint

    (tmp_path / "iter_4.pth").write_bytes(b"")
    (tmp_path / "last_checkpoint").write_text(f"{tmp_path / 'iter_4.pth'}\n")
    assert resolve_checkpoint(tmp_path) == tmp_path / "iter_4.pth"
    assert resolve_checkpoint(tmp_path / "iter_4.pth") == tmp_path / "iter_4.pth"
