"""``sa2va-rl setup``: offline set-up steps (``make setup`` runs them through ``tools/setup/``; nothing downloads)."""
from __future__ import annotations

from projects.llava_sam2.rl_train.cli.main import PACKAGE, run_command

# name -> (module with main(argv) -> int, one-line help)
COMMANDS = {
    "wordnet": (f"{PACKAGE}.cli.setup_wordnet",
                "provision WordNet 3.0 for nltk's METEOR from local or Debian files (--target $NLTK_DATA)"),
    "tiny-tokenizer": (f"{PACKAGE}.cli.setup_tokenizer",
                       "rebuild (or --check) the shipped tiny tokenizer, bit-identically"),
    "tiny-checkpoint": (f"{PACKAGE}.cli.setup_checkpoint",
                        "write a seeded random tiny Sa2VA checkpoint in the HF layout, with its tokenizer"),
}


def main(argv: list[str] | None = None) -> int:
    return run_command(COMMANDS, argv, "sa2va-rl setup", __doc__.splitlines()[0])
