"""Time prefix_attention's kernels on one GPU at the 4b decode shape (B=8, G=8, Hkv=2, r=8, hd=128, L=1850, tail 134
of which 64 slots are visible, so the tail blocks past them are skipped) for a few launch settings, against SDPA on the
full rows (the fast_fused_sdpa step's attention). One line per setting: microseconds per call (36 calls in a CUDA
graph, as a step's layers, replayed 20 times) and the largest difference to SDPA.
  python3 research/prefix_attention_tune.py"""
import itertools

import torch
import torch.nn.functional as F

from projects.llava_sam2.rl_train.model.decoding import prefix_attention as pa


def main():
    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    B, G, Hkv, R, hd, L, T = 8, 8, 2, 8, 128, 1850, 134
    N, H = B * G, Hkv * R
    q = torch.randn(N, H + Hkv, hd, device=dev, dtype=dt)[:, :H]
    pk, pv = (torch.randn(B, Hkv, L, hd, device=dev, dtype=dt) for _ in range(2))
    tk, tv = (torch.randn(N, Hkv, T, hd, device=dev, dtype=dt) for _ in range(2))
    neg = torch.finfo(dt).min
    pb = torch.zeros(B, L, device=dev, dtype=dt)
    pb[:, :40] = neg
    tb = torch.full((N, T), neg, device=dev, dtype=dt)
    tb[:, :64] = 0
    args = (q, pk, pv, pb, tk, tv, tb, torch.tensor([64], device=dev), hd ** -0.5)
    keys = torch.cat([pk.repeat_interleave(G, 0), tk], 2)
    values = torch.cat([pv.repeat_interleave(G, 0), tv], 2)
    bias = torch.cat([pb.repeat_interleave(G, 0), tb], 1)[:, None, None]
    qc = q.contiguous()[:, :, None]

    def sdpa():
        return F.scaled_dot_product_attention(qc, keys, values, attn_mask=bias, scale=hd ** -0.5, enable_gqa=True)

    def timed(fn, calls=36, replays=20):
        """Device time per call: ``calls`` calls captured in one CUDA graph (as in the decode step), replayed."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / (calls * replays) * 1e3

    ref = sdpa()[:, :, 0].float()
    print(f"sdpa full rows: {timed(sdpa):.1f} us")
    for per_sm, pw, tw, st in itertools.product((1, 2, 4), (4, 8), (2, 4), (1, 2, 3)):
        pa.PROGRAMS_PER_SM = per_sm
        pa.LAUNCH.update(prefix_warps=pw, tail_warps=tw, stages=st)
        try:
            out = pa.shared_prefix_decode_attention(*args)
            err = (out.float() - ref).abs().max().item()
            us = timed(lambda: pa.shared_prefix_decode_attention(*args))
        except Exception as e:  # a setting the compiler refuses
            print(f"per_sm={per_sm} prefix_warps={pw} tail_warps={tw} stages={st}: {type(e).__name__} {e}"[:200])
            continue
        print(f"per_sm={per_sm} prefix_warps={pw} tail_warps={tw} stages={st}: {us:.1f} us  max|diff| {err:.2e}")


if __name__ == "__main__":
    main()
