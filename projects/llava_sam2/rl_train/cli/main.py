"""``sa2va-rl``: every user command of Sa2VA-RL behind one entry point.

    sa2va-rl --help                   # the commands, one line each
    sa2va-rl COMMAND --help           # a command's own settings
    python -m projects.llava_sam2.rl_train.cli COMMAND ...   # the same without the console script

``COMMANDS`` below is the only list of user commands: a row names the module whose ``main(argv) -> int`` runs the
command, and the one-line help ``sa2va-rl --help`` prints. A command with sub-commands (``bench``, ``judge``,
``prompt-rl``, ``setup``) is a module with its own ``COMMANDS`` table of the same shape, whose ``main`` calls
:func:`run_command` on it.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Mapping, Sequence

PACKAGE = "projects.llava_sam2.rl_train"

# name -> (module exposing main(argv: list[str] | None) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": (f"{PACKAGE}.cli.train",
              "train a config in-process, with xtuner train's arguments; a failed run exits non-zero"),
    "export": (f"{PACKAGE}.cli.export", "merge LoRA into a trained checkpoint and write the upstream HF layout"),
    "convert": (f"{PACKAGE}.cli.convert",
                "upstream XTuner SFT checkpoints -> HF layout, and RL results -> XTuner .pth (no upstream code)"),
    "evaluate": (f"{PACKAGE}.cli.evaluate",
                 "held-out RES / caption / cycle metrics of one system, with bootstrap CIs"),
    "report": (f"{PACKAGE}.cli.report", "markdown + PNG report comparing evaluation runs of one split"),
    "inspect": (f"{PACKAGE}.cli.inspect_dataset",
                "check a dataset config: counts, bad samples, a PNG grid (video: strips)"),
    "demo": (f"{PACKAGE}.demo.pipeline", "the embedded CPU demo: pretrained tiny Sa2VA -> GRPO -> held-out report"),
    "demo-controls": (f"{PACKAGE}.demo.controls",
                      "the demo over several seeds plus its controls (more SFT, one loop, mask policies)"),
    "pretrain-tiny": (f"{PACKAGE}.demo.pretrain_tiny",
                      "build the text-aware tiny Sa2VA the demo starts from (shapes world; GPU or CPU)"),
    "prefilter": (f"{PACKAGE}.cli.prefilter",
                  "group inference over a config's dataset: keep the prompts whose GRPO rewards vary"),
    "bench": (f"{PACKAGE}.cli.bench",
              "benchmarks (rl-step, decode, model, loader, judge); figures: docs/benchmarks.md"),
    "judge": (f"{PACKAGE}.cli.judge", "LLM judge: score predictions on DLC-Bench, pre-generate judge questions"),
    "prompt-rl": (f"{PACKAGE}.cli.prompt_rl",
                  "optional GT-free line: quality cache, reward network, prompt policy, post-processing, report"),
    "check": (f"{PACKAGE}.cli.check", "check an install on a GPU host: 1 GPU, DDP, ZeRO-2, parity, resume, scaling"),
    "setup": (f"{PACKAGE}.cli.setup", "offline set-up: WordNet for METEOR, the tiny tokenizer, a tiny checkpoint"),
}


def _listing(table: Mapping[str, tuple[str, str]]) -> str:
    width = max(map(len, table)) + 2
    return "\n".join(f"  {name:<{width}}{help_line}" for name, (_, help_line) in table.items())


def run_command(table: Mapping[str, tuple[str, str]], argv: Sequence[str] | None, prog: str,
                description: str) -> int:
    """Parse ``COMMAND [ARGS...]`` against ``table``, import the command's module and return its ``main(ARGS)``."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description.replace("``", ""), formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=f"{prog} [-h] COMMAND [ARGS ...]",
        epilog=f"commands:\n{_listing(table)}\n\nRun `{prog} COMMAND --help` for a command's settings.")
    parser.add_argument("command", choices=list(table), metavar="COMMAND", help="one of the commands below")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        parser.print_help()
        return 2
    args = parser.parse_args(argv)
    module = importlib.import_module(table[args.command][0])
    code = module.main(args.args)
    return 0 if code is None else int(code)


def main(argv: list[str] | None = None) -> int:
    return run_command(COMMANDS, argv, "sa2va-rl", "Sa2VA-RL: RL post-training for Sa2VA, every user command.")


if __name__ == "__main__":
    sys.exit(main())
