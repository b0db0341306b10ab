"""``sa2va-rl bench``: benchmarks; the measured figures and their exact commands are in docs/benchmarks.md."""
from __future__ import annotations

from projects.llava_sam2.rl_train.cli.main import PACKAGE, run_command

# name -> (module with main(argv) -> int, one-line help)
COMMANDS = {
    "rl-step": (f"{PACKAGE}.benchmarks.rl_step",
                "one dual-loop GRPO step phase by phase, next to the generate() and naive baselines"),
    "decode": (f"{PACKAGE}.benchmarks.decode", "caption decoding: HF generate vs the fast decode path, tokens/s"),
    "model": (f"{PACKAGE}.benchmarks.model", "build, greedy predict and one SFT step of a size preset"),
    "loader": (f"{PACKAGE}.benchmarks.loader", "DataLoader throughput over a generated COCO-style region set"),
    "judge": (f"{PACKAGE}.benchmarks.judge", "LLM-judge throughput against a local stub server, per concurrency"),
    "mask-action": (f"{PACKAGE}.benchmarks.mask_action",
                    "loop 1 vs loop 2 gradient scale, partner-visible share and clipping of the mask action"),
}


def main(argv: list[str] | None = None) -> int:
    return run_command(COMMANDS, argv, "sa2va-rl bench", __doc__.splitlines()[0])
