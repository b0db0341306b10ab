"""``sa2va-rl prompt-rl``: the optional GT-free line (docs/prompt_rl.md), one sub-command per pipeline step.

Needs the ``prompt_rl`` extra (gymnasium, stable-baselines3) for the policy step. The segmenter it starts from
is any Sa2VA checkpoint (``sa2va-rl prompt-rl segmenter`` trains the tiny one of the documented run).
"""
from __future__ import annotations

from projects.llava_sam2.rl_train.cli.main import PACKAGE, run_command

_STEPS = f"{PACKAGE}.prompt_rl.steps"
# name -> (module with main(argv) -> int, one-line help), in pipeline order
COMMANDS = {
    "segmenter": (f"{_STEPS}.train_segmenter",
                  "a short seeded CPU SFT of the tiny Sa2VA preset on shapes-world referring segmentation"),
    "quality-dataset": (f"{_STEPS}.build_quality_dataset",
                        "a checkpoint's masks for K prompts per sample, with their true Dice (the quality cache)"),
    "reward-net": (f"{_STEPS}.train_reward_net",
                   "train the GT-free mask-quality network on a cache; compare it with the free scorers"),
    "policy": (f"{_STEPS}.train_prompt_policy",
               "prompt selection (PPO, LinUCB, reranking) against fixed prompts and the oracle, held out"),
    "postprocess": (f"{_STEPS}.tune_postprocess", "tune a logit threshold + morphology step on train images"),
    "report": (f"{_STEPS}.write_report", "one markdown report + charts of every step of a run directory"),
}


def main(argv: list[str] | None = None) -> int:
    return run_command(COMMANDS, argv, "sa2va-rl prompt-rl", __doc__.splitlines()[0])
