"""Host synchronisations of one timed bench iteration, per phase (docs/speed.md, "Host synchronisations of the
step"): ``python -m research.count_host_syncs [extra rl-step flags]``; the defaults are the tiny CPU step."""
import sys

import torch

from projects.llava_sam2.rl_train.benchmarks import rl_step as bench
from projects.llava_sam2.rl_train.benchmarks.host_syncs import HostSyncCounter

clocks = []


class RecordedClock(bench.PhaseClock):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        clocks.append(self)


def phase() -> str:
    """The outermost open phase of the timed iteration ("outside" for warm-up and set-up)."""
    clock = clocks[-1] if clocks else None
    return clock.open_phases[0] if clock is not None and clock.active and clock.open_phases else "outside"


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    bench.PhaseClock = RecordedClock
    with HostSyncCounter(phase=phase) as syncs:
        bench.run_benchmark(["--preset", "tiny", "--batch", "2", "--num-generations", "2", "--max-new-tokens", "4",
                             "--warmup", "1", "--iters", "1", "--baselines", "", "--storage", "cpu", "--force-seg",
                             "--caption-lengths", "2,3", "--prompt-length-multiple", "64",
                             "--completion-length-multiple", "4", *argv])
    for key in [key for key in syncs.counts if key[0] == "outside"]:
        del syncs.counts[key]
    print(syncs.table())
    print(syncs.by_phase())


if __name__ == "__main__":
    main(sys.argv[1:])
