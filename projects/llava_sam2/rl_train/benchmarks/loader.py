"""Loader throughput on a generated COCO-style region set (the same path as real data).

Usage::

    sa2va-rl bench loader --num-samples 1000 --workers 0 2

Writes ``--num-samples`` shapes-world samples as annotations.json + PNG images (``--out-dir``, a
temporary folder by default), then times full passes of a DataLoader over ``CocoRegionDataset``
with ``region_collate`` for each ``--workers`` value. One pass includes worker start-up; it decodes
every image, decodes and validates every RLE mask, and moves samples to the main process.

``--preprocess PRESET`` (e.g. ``4b``, ``tiny``) times the collate a training run uses instead,
``PreprocessingCollate`` with the preset's processor: each batch also carries the step's host preprocessing
(InternVL tiles, SAM2 input, gt masks, region cells), the work taken out of the GRPO step's encode phase. Use
``--image-size 896`` for the 4b bench's images (2x2 tiles + thumbnail).
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

from projects.llava_sam2.rl_train.data import CocoRegionDataset, PreprocessingCollate, ShapesWorld, region_collate
from projects.llava_sam2.rl_train.model.network.presets import PRESETS, build_preset
from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

PROG = "sa2va-rl bench loader"


def preset_processor(preset: str) -> Sa2VAProcessor:
    """The processor of a preset as the RL step builds it (the tiny tokenizer stands in for the real one: the
    preprocessing does not read it)."""
    tokenizer = load_tiny_tokenizer()
    config = build_preset(preset, vocab_size=len(tokenizer) if preset == "tiny" else None)
    return Sa2VAProcessor.from_config(tokenizer, config, empty_region="dilate_to_one_cell")


def time_pass(dataset, batch_size: int, num_workers: int, collate=region_collate) -> tuple[int, float]:
    """Samples delivered by one full pass and its wall time in seconds."""
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                        collate_fn=collate)
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
    parser.add_argument("--preprocess", default=None, choices=sorted(PRESETS), metavar="PRESET",
                        help="collate with PreprocessingCollate and this preset's processor (the GRPO step's host "
                             "preprocessing in the loader; default: plain region_collate)")
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
        collate = region_collate if args.preprocess is None else PreprocessingCollate(preset_processor(args.preprocess))
        print(f"collate: {'region_collate' if args.preprocess is None else 'PreprocessingCollate, ' + args.preprocess}")
        for workers in args.workers:
            runs = [time_pass(dataset, args.batch_size, workers, collate) for _ in range(args.repeats)]
            delivered, seconds = min(runs, key=lambda run: run[1])
            print(f"num_workers={workers} batch_size={args.batch_size}: {delivered} samples in "
                  f"{seconds:.2f} s = {delivered / seconds:.0f} samples/s (best of {args.repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
