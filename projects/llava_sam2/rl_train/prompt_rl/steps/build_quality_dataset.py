"""Build the mask-quality cache: a checkpoint's masks for K candidate prompts per sample, with true quality.

    sa2va-rl prompt-rl quality-dataset CHECKPOINT OUT_DIR [--num-images 200] [--num-prompts 11]
        [--prompts '0:0,1:2,...'] [--dataset shapes --split val --seed 0 | --dataset coco --ann-file F]
        [--heldout-fraction 0.4] [--same-as OTHER_CACHE]

CHECKPOINT is any Sa2VA checkpoint dir with its tokenizer (``save_pretrained`` layout). ``--same-as`` rebuilds
exactly the samples, prompts and train/held-out split of another cache with a new checkpoint (how a fine-tuned
model is measured on the same held-out images). Writes OUT_DIR/quality.npz + meta.json
(prompt_rl/quality_data.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from projects.llava_sam2.rl_train.prompt_rl.prompts import (
    DEFAULT_NUM_PROMPTS, PromptSpec, default_prompt_specs, parse_prompt_specs)
from projects.llava_sam2.rl_train.prompt_rl.quality_data import (
    build_quality_data, load_quality_data, save_quality_data)

PROG = "sa2va-rl prompt-rl quality-dataset"


def load_checkpoint(path: str):
    """(model, processor) of a checkpoint dir holding the weights and the tokenizer."""
    from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import load_pretrained
    from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
    from projects.llava_sam2.rl_train.model.text.tokenizer import load_tokenizer

    if not Path(path, "config.json").is_file():
        raise ValueError(f"checkpoint {path}: no config.json; pass a save_pretrained directory")
    tokenizer = load_tokenizer(path)
    model = load_pretrained(path, torch_dtype=torch.float32)
    model.bind_tokenizer(tokenizer)
    return model, Sa2VAProcessor.from_config(tokenizer, model.config)


def build_dataset(source: dict):
    if source["dataset"] == "shapes":
        from projects.llava_sam2.rl_train.data.shapes import ShapesWorld

        return ShapesWorld(source["split"], source["num_images"], seed=source["seed"])
    if source["dataset"] == "coco":
        from torch.utils.data import Subset

        from projects.llava_sam2.rl_train.data.coco import CocoRegionDataset

        if not source.get("ann_file"):
            raise ValueError("--dataset coco needs --ann-file annotations.json")
        data = CocoRegionDataset(source["ann_file"], source.get("image_root"))
        return Subset(data, range(min(source["num_images"], len(data))))
    raise ValueError(f"--dataset {source['dataset']!r}: expected 'shapes' or 'coco'")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="Sa2VA checkpoint directory (weights + tokenizer)")
    parser.add_argument("out_dir", help="cache directory to write")
    parser.add_argument("--dataset", choices=("shapes", "coco"), default="shapes", help="sample source")
    parser.add_argument("--split", default="val", help="ShapesWorld split (the segmenter trains on 'train')")
    parser.add_argument("--num-images", type=int, default=200, help="samples to segment")
    parser.add_argument("--ann-file", default=None, help="COCO-style annotations.json (--dataset coco)")
    parser.add_argument("--image-root", default=None, help="COCO image folder (default: next to --ann-file)")
    parser.add_argument("--num-prompts", type=int, default=DEFAULT_NUM_PROMPTS, help="K, first K default specs")
    parser.add_argument("--prompts", default=None, help="explicit specs 'template:slot,...' (overrides --num-prompts)")
    parser.add_argument("--heldout-fraction", type=float, default=0.4, help="images held out (split by image)")
    parser.add_argument("--image-side", type=int, default=64, help="side of the cached images (reward-net input)")
    parser.add_argument("--seed", type=int, default=0, help="dataset seed and split seed")
    parser.add_argument("--same-as", default=None, help="reuse samples, prompts and split of this cache")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1: on a shared 2-core machine 2 threads ran ~10x slower)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    split_override = None
    if args.same_as:
        other = load_quality_data(args.same_as)
        source, split_override = dict(other.meta["source"]), other.is_heldout
        specs = tuple(PromptSpec(t, s) for t, s in other.meta["prompt_specs"])
        args.heldout_fraction, args.image_side = other.meta["heldout_fraction"], other.meta["image_side"]
    else:
        source = {"dataset": args.dataset, "split": args.split, "num_images": args.num_images, "seed": args.seed,
                  "ann_file": args.ann_file, "image_root": args.image_root}
        specs = parse_prompt_specs(args.prompts) if args.prompts else default_prompt_specs(args.num_prompts)
    model, processor = load_checkpoint(args.checkpoint)
    data = build_quality_data(model, processor, build_dataset(source), specs, heldout_fraction=args.heldout_fraction,
                              seed=source["seed"], image_side=args.image_side, source=source)
    if split_override is not None:
        if data.meta["sample_ids"] != other.meta["sample_ids"]:
            raise ValueError(f"--same-as {args.same_as}: rebuilt samples differ from the cache's; is the dataset the same?")
        data.arrays["is_heldout"] = split_override.copy()
    data.meta["checkpoint"] = str(args.checkpoint)
    save_quality_data(data, args.out_dir)
    held = data.split_indices("heldout")
    summary = {"samples": data.num_samples, "prompts": data.num_prompts, "heldout": int(len(held)),
               "mean_dice_per_prompt": np.round(data.dice.mean(0), 4).tolist(),
               "oracle_dice": round(float(data.dice.max(1).mean()), 4), "degenerate": data.meta["degenerate"],
               "build_seconds": data.meta["build_seconds"]}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
