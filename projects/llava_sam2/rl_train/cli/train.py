"""``sa2va-rl train CONFIG [xtuner train args]``: train a Sa2VA-RL (or SFT) config with XTuner's trainer.

Same arguments as ``xtuner train`` (``--work-dir``, ``--deepspeed``, ``--resume``, ``--seed``, ``--cfg-options``,
``--launcher``), with these differences that matter for scripts and CI:

* XTuner's ``tools/train.py`` ``main()`` runs in this process, so a failed run exits non-zero (the ``xtuner train``
  CLI runs it in a child process and ignores the child's exit code; docs/stack.md §1).
* ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` is set unless already set: MMEngine and XTuner ``torch.load`` our own
  checkpoints (optimizer state, RNG state, EMA partner), which torch >= 2.6 refuses weights-only (docs/stack.md §2).
* Without CUDA, the run happens inside ``engine/mmengine_seams.cpu_launch()`` (gloo DDP, DeepSpeed on CPU). Every
  run, CPU or GPU, uses one intra-op CPU thread per process unless ``OMP_NUM_THREADS`` is set, as torchrun's workers
  do (``engine/launch.py``).
* ``--resume auto`` resumes from the newest complete checkpoint of the work dir (none: a fresh start), and a
  worker started by torchrun dies with it (``engine/launch.py``; docs/failure_behaviour.md).

``tools/train.py`` is the same command as a script (the launcher the Sa2VA workflow expects; it also stops with a
clear message in an interpreter without the stack); multi-process: ``tools/dist_train.sh CONFIG NGPUS [args]`` runs
that script under torchrun.
"""
from __future__ import annotations

import argparse
import os
import sys

PROG = "sa2va-rl train"


def help_parser() -> argparse.ArgumentParser:
    """This command's ``--help``: xtuner train's arguments, described for this project.

    XTuner's own parser (description "Train LLM") still parses the arguments; this one only answers ``--help``,
    without importing the trainer. ``tests/test_cli.py`` checks that both accept the same options."""
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a Sa2VA-RL GRPO config (or an SFT config) with XTuner's trainer, in this process: a failed\n"
                    "run exits non-zero, which `xtuner train` does not (its CLI ignores its child's exit code).\n"
                    "Without CUDA the run uses gloo on CPU.",
        epilog="examples:\n"
               "  sa2va-rl train projects/llava_sam2/configs/rl/tiny_grpo_cycle_cpu.py --work-dir work_dirs/tiny\n"
               "  sa2va-rl train CONFIG --resume auto   # continue from the work dir's newest complete checkpoint\n"
               "multi-process: tools/dist_train.sh CONFIG NGPUS [these arguments]; failures and resume:\n"
               "docs/failure_behaviour.md")
    parser.add_argument("config", help="the training config (projects/llava_sam2/configs/rl/*.py)")
    parser.add_argument("--work-dir", help="where logs and checkpoints go (default: work_dirs/<config name>)")
    parser.add_argument("--deepspeed", help="DeepSpeed: a .json config, or a name such as deepspeed_zero2")
    parser.add_argument("--resume", help="'auto': the newest complete checkpoint of the work dir (a fresh start when "
                        "there is none); or a checkpoint path (iter_N.pth or a DeepSpeed directory)")
    parser.add_argument("--seed", type=int, help="random seed (default: the config's randomness.seed)")
    parser.add_argument("--cfg-options", nargs="+", metavar="KEY=VALUE", help="override config entries, e.g. "
                        "train_cfg.max_iters=10 optim_wrapper.optimizer.lr=1e-5")
    parser.add_argument("--launcher", choices=["none", "pytorch", "slurm", "mpi"], default="none",
                        help="job launcher (tools/dist_train.sh passes pytorch)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=0, help="set by the launcher")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        help_parser().parse_args(["--help"])  # prints the help and exits 0, as argparse does
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    from projects.llava_sam2.rl_train.engine.launch import die_with_parent, resolve_resume, set_cpu_threads
    from projects.llava_sam2.rl_train.engine.mmengine_seams import cpu_launch

    die_with_parent()
    argv = resolve_resume(argv)
    set_cpu_threads()  # GPU runs too: torchrun sets one thread per worker; a one-process run must not differ
    from xtuner.tools import train as xtuner_train

    sys.argv = [PROG, *argv]  # xtuner parses sys.argv (argv[0] only names the program in its --help)
    with cpu_launch():
        xtuner_train.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
