"""``sa2va-rl train CONFIG [xtuner train args]``: train a Sa2VA-RL (or SFT) config with XTuner's trainer.

Same arguments as ``xtuner train`` (``--work-dir``, ``--deepspeed``, ``--resume``, ``--seed``, ``--cfg-options``,
``--launcher``), with these differences that matter for scripts and CI:

* XTuner's ``tools/train.py`` ``main()`` runs in this process, so a failed run exits non-zero (the ``xtuner train``
  CLI runs it in a child process and ignores the child's exit code; environment.md fact 10).
* ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` is set unless already set: MMEngine and XTuner ``torch.load`` our own
  checkpoints (optimizer state, RNG state, EMA partner), which torch >= 2.6 refuses in weights-only mode (fact 18).
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

import os
import sys

PROG = "sa2va-rl train"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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
