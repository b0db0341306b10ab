"""Loader throughput on a generated COCO-style region set (the same path as real data).

Usage::

    sa2va-rl bench loader --num-samples 1000 --workers 0 2

Writes ``--num-samples`` shapes-world samples as annotations.json + PNG images (``--out-dir``, a
temporary folder by default), then times full passes of a DataLoader over ``CocoRegionDataset``
with ``region_collate`` for each ``--workers`` value. One pass includes worker start-up; it decodes
every image, decodes and validates every RLE mask, and moves samples to the main process.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader

from projects.llava_sam2.rl_train.data import CocoRegionDataset, ShapesWorld, region_collate

PROG = "sa2va-rl bench loader"


def time_pass(dataset, batch_size: int, num_workers: int) -> tuple[int, float]:
    """Samples delivered by one full pass and its wall time in seconds."""
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                        collate_fn=region_collate)
    start = time.perf_counter()
    delivered = sum(len(batch) for batch in loader)
    return delivered, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-samples", type=int, default=1000)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--repeats", type=int, default=2, help="passes per setting; the best is reported")
    parser.add_argument("--out-dir", default=None, help="where to write the set (default: a temp dir)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.out_dir or tmp
        start = time.perf_counter()
        world = ShapesWorld("train", args.num_samples, seed=0, image_size=args.image_size)
        ann_file = world.write_coco(out_dir)
        print(f"wrote {args.num_samples} shapes samples ({args.image_size}x{args.image_size} PNG) to "
              f"{out_dir} in {time.perf_counter() - start:.1f} s")
        dataset = CocoRegionDataset(ann_file, name=world.name)
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
              f"torch {torch.__version__}, torch threads {torch.get_num_threads()}")
        for workers in args.workers:
            runs = [time_pass(dataset, args.batch_size, workers) for _ in range(args.repeats)]
            delivered, seconds = min(runs, key=lambda run: run[1])
            print(f"num_workers={workers} batch_size={args.batch_size}: {delivered} samples in "
                  f"{seconds:.2f} s = {delivered / seconds:.0f} samples/s (best of {args.repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
