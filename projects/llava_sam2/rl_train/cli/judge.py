"""``sa2va-rl judge``: the LLM judge outside training (any OpenAI-compatible endpoint; docs/rewards.md)."""
from __future__ import annotations

from projects.llava_sam2.rl_train.cli.main import PACKAGE, run_command

# name -> (module with main(argv) -> int, one-line help)
COMMANDS = {
    "dlc-bench": (f"{PACKAGE}.cli.judge_dlc_bench",
                  "score predicted captions on DLC-Bench's qa.json (Pos / Neg / Avg), cached and resumable"),
    "questions": (f"{PACKAGE}.cli.judge_questions",
                  "generate DLC-Bench-style questions for a dataset's captions into the judge cache"),
}


def main(argv: list[str] | None = None) -> int:
    return run_command(COMMANDS, argv, "sa2va-rl judge", __doc__.splitlines()[0])
