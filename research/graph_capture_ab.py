"""A/B of the decode graphs' capture in one `sa2va-rl bench rl-step` process (one H100 per process; run both arms in
the same device call).

    python3 research/graph_capture_ab.py torch  -- <bench rl-step arguments>   # the capture before: torch.cuda.graph
    python3 research/graph_capture_ab.py pooled -- <bench rl-step arguments>   # the shipped GraphedCall

The ``torch`` arm replaces ``GraphedCall.__call__`` by the capture the decode used before: ``torch.cuda.graph``, whose
entry synchronises the device and empties the device and pinned-host allocator caches before every capture, into a
private pool per graph.
"""
import sys

import torch

from projects.llava_sam2.rl_train.benchmarks import rl_step
from projects.llava_sam2.rl_train.model.decoding import fast_decode_step


def capture_through_torch_graph(self):
    self.calls += 1
    with torch.cuda.device(self.device):
        if self.graph is None and self.calls <= self.warmup:
            main, side = torch.cuda.current_stream(), torch.cuda.Stream()
            side.wait_stream(main)
            with torch.cuda.stream(side):
                output = self.fn()
            main.wait_stream(side)
            output.record_stream(main)
            return output
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.output = self.fn()
        self.graph.replay()
        return self.output


if __name__ == "__main__":
    arm, sep, *bench_args = sys.argv[1:]
    if arm not in ("torch", "pooled") or sep != "--":
        sys.exit("usage: graph_capture_ab.py torch|pooled -- <bench rl-step arguments>")
    if arm == "torch":
        fast_decode_step.GraphedCall.__call__ = capture_through_torch_graph
    print(f"graph capture arm: {arm}", flush=True)
    sys.exit(rl_step.main(bench_args))
