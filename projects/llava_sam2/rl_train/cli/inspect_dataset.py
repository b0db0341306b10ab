"""Check a region or video dataset before a long run: counts, bad samples, and a PNG grid of samples.

Usage::

    sa2va-rl inspect projects/llava_sam2/configs/rl/_base_/datasets/coco_regions.py \
        --cfg-options dataset.ann_file=/data/mine/annotations.json dataset.image_root=/data/mine \
        --out work_dirs/inspect_coco.png --num 16

The dataset is built from the config's ``dataset`` entry, or from a training config's
``train_dataloader.dataset`` (its ``region_dataset`` for SFT); ``--key`` picks another entry. It is built
with ``on_bad_sample='skip'`` so that every problem is listed instead of the first one raising, and with
the model's input check (the config's model and ``processor_cfg.empty_region``; the released checkpoints'
16x16 region grid when no model config is found), so samples the model cannot take are listed too.
``--check N`` scans the first N samples (default: all) for the counts.

A video dataset (``VideoRegionSample``: the ``video_*.py`` dataset configs) is judged the same way (the input check
on each sample's key frame) and drawn as one PNG strip per sample (``evaluation.plots.plot_video_strip``):
``--out work_dirs/x.png`` writes ``work_dirs/x_00.png``, ``work_dirs/x_01.png``, ...
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections import Counter

import numpy as np

from projects.llava_sam2.rl_train.data.bad_samples import SkippedSample
from projects.llava_sam2.rl_train.data.types import VideoRegionSample
from projects.llava_sam2.rl_train.engine.builders import input_check_from_config
from projects.llava_sam2.rl_train.model.text.input_check import UPSTREAM_REGION_GRID_SIZE, InputCheck

PROG = "sa2va-rl inspect"


# where a config keeps its region dataset, tried in this order when --key is not given: a dataset config, an SFT
# training config (the region data under the SFT items), a GRPO training config
DATASET_KEYS = ("dataset", "train_dataloader.dataset.region_dataset", "train_dataloader.dataset")


def lookup(cfg, dotted: str):
    """``cfg['a']['b']`` for ``'a.b'``; None when a part is missing."""
    node = cfg
    for part in dotted.split("."):
        if not hasattr(node, "get") or node.get(part) is None:
            return None
        node = node[part]
    return node


def find_dataset_cfg(cfg, config: str, key: str | None) -> tuple[str, object]:
    """(key, dataset config): ``key`` when given, else the first of ``DATASET_KEYS`` that holds a dataset config."""
    for candidate in (key,) if key else DATASET_KEYS:
        node = lookup(cfg, candidate)
        if hasattr(node, "get") and node.get("type") is not None:
            return candidate, node
    tried = f"'{key}'" if key else f"any of {list(DATASET_KEYS)}"
    raise ValueError(f"{config} has no dataset config (a dict with a 'type') at {tried}; pass --key with the "
                     "dataset's entry, e.g. --key train_dataloader.dataset")


def input_check_of(cfg) -> tuple[InputCheck, str]:
    """The input check training would apply (``engine.builders.input_check_from_config`` of the config's model), or
    the released checkpoints' (16x16 grid, ``empty_region='raise'``) when there is no readable model config; and a
    line saying which."""
    model = lookup(cfg, "model") or {}
    check = input_check_from_config(model) if model else None
    source = "the config's model" if check is not None else "no model config found: the released Sa2VA checkpoints'"
    check = check or InputCheck(UPSTREAM_REGION_GRID_SIZE, "raise")
    grid = check.region_grid_size
    return check, f"{grid}x{grid} region grid ({source}), empty_region={check.empty_region!r}"


def build_dataset(config: str, key: str | None, cfg_options: dict | None, keep_raise: bool):
    """The config's region dataset (``on_bad_sample='skip'`` unless ``keep_raise``), with the model-side input check
    applied; returns (dataset, a line saying which entry and which check were used)."""
    from mmengine.config import Config
    from xtuner.registry import BUILDER

    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    key, dataset_cfg = find_dataset_cfg(cfg, config, key)
    if "on_bad_sample" in dataset_cfg and not keep_raise:
        dataset_cfg.on_bad_sample = "skip"
    dataset = BUILDER.build(dataset_cfg)
    check, described = input_check_of(cfg)
    if hasattr(dataset, "set_input_check"):
        dataset.set_input_check(check)
        return dataset, f"dataset: {key} of {config}; model input check: {described}"
    return dataset, f"dataset: {key} of {config}; model input check: not applied ({type(dataset).__name__})"


def scan(dataset, limit: int | None) -> tuple[list[int], dict]:
    """Load the first ``limit`` samples; return the good indices and summary statistics."""
    good, stats = [], {"sources": Counter(), "categories": Counter(), "images": set(),
                       "captions": [], "expressions": [], "area": [], "sizes": Counter(),
                       "frames": [], "absent": []}  # the last two: video samples only
    for index in range(len(dataset) if limit is None else min(limit, len(dataset))):
        sample = dataset[index]
        if isinstance(sample, SkippedSample):
            continue
        good.append(index)
        stats["sources"][sample.source] += 1
        stats["categories"][sample.category] += 1
        stats["images"].add(sample.sample_id.split("#")[0])
        stats["captions"].append(len(sample.captions))
        stats["expressions"].append(len(sample.expressions))
        if isinstance(sample, VideoRegionSample):
            stats["area"].append(float(sample.gt_masks.mean()))
            stats["sizes"][sample.frames[0].size] += 1
            stats["frames"].append(len(sample.frames))
            stats["absent"].append(int((~sample.gt_masks.any(axis=(1, 2))).sum()))
        else:
            stats["area"].append(float(sample.gt_mask.mean()))
            stats["sizes"][sample.image.size] += 1
    return good, stats


def report(dataset, good: list[int], stats: dict, scanned: int) -> str:
    name = getattr(dataset, "name", type(dataset).__name__)
    video = bool(stats["frames"])
    lines = [f"dataset {name} ({type(dataset).__name__}): {len(dataset)} samples indexed, "
             f"{scanned} scanned, {len(good)} good, {len(stats['images'])} {'videos' if video else 'images'}"]
    if getattr(dataset, "excluded", None):
        lines.append(f"left out while indexing (not single regions): {dataset.excluded}")
    if good:
        lines.append(f"captions per sample: mean {np.mean(stats['captions']):.2f}, "
                     f"without any: {sum(c == 0 for c in stats['captions'])}")
        lines.append(f"expressions per sample: mean {np.mean(stats['expressions']):.2f}, "
                     f"without any: {sum(e == 0 for e in stats['expressions'])}")
        area = np.array(stats["area"])
        lines.append(f"mask area / {'clip (all frames)' if video else 'image'}: min {area.min():.4f} "
                     f"median {np.median(area):.4f} max {area.max():.4f}")
        if video:
            lines.append(f"frames per sample: mean {np.mean(stats['frames']):.2f}; frames without the object: "
                         f"mean {np.mean(stats['absent']):.2f}, max {max(stats['absent'])}")
        lines.append(f"sources: {dict(stats['sources'].most_common(10))}")
        lines.append(f"categories (top 10): {dict(stats['categories'].most_common(10))}")
        lines.append(f"{'frame' if video else 'image'} sizes (W, H) (top 5): {dict(stats['sizes'].most_common(5))}")
    log = getattr(dataset, "bad_samples", None)
    lines.append("bad samples: " + (log.report(name) if log is not None else "not tracked"))
    return "\n".join(lines)


def draw_grid(dataset, indices: list[int], out_path: str, columns: int = 4) -> None:
    """Images with the outside dimmed and the region outlined, titled with id, caption, expression."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(1, -(-len(indices) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 4.6 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, index in zip(axes.flat, indices):
        sample = dataset[index]
        pixels = np.asarray(sample.image, dtype=np.float32) / 255.0          # [H, W, 3]
        pixels[~sample.gt_mask] *= 0.45  # dim the outside, keep the region's true colours
        ax.imshow(pixels)
        if min(sample.gt_mask.shape) >= 2:  # matplotlib's contour needs at least a 2x2 array
            ax.contour(sample.gt_mask.astype(float), levels=[0.5], colors="cyan", linewidths=1.2)
        text = [sample.sample_id]
        if sample.captions:
            text.append("C: " + sample.captions[0])
        if sample.expressions:
            text.append("E: " + sample.expressions[0])
        ax.set_title("\n".join(textwrap.shorten(t, 120) for t in text), fontsize=7, loc="left")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.savefig(out_path, dpi=80, bbox_inches="tight", pad_inches=0.2)
    plt.close(fig)


def draw_strips(dataset, indices: list[int], out_path: str) -> list[str]:
    """One ``plot_video_strip`` PNG per video sample, ``<out_path without .png>_<k>.png``; returns the paths."""
    from projects.llava_sam2.rl_train.evaluation.plots import plot_video_strip

    stem = out_path[:-len(".png")] if out_path.endswith(".png") else out_path
    os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
    return [plot_video_strip(dataset[index], f"{stem}_{k:02d}.png") for k, index in enumerate(indices)]


def main(argv: list[str] | None = None) -> int:
    from mmengine.config import DictAction

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="MMEngine config holding a dataset entry")
    parser.add_argument("--key", default=None, help="config entry of the dataset, dotted (default: the first of "
                        + ", ".join(DATASET_KEYS) + " that the config has)")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, help="override entries, key=value")
    parser.add_argument("--out", default="work_dirs/inspect_dataset.png", help="PNG grid path (video: the strips' "
                        "path stem, <out>_00.png, ...)")
    parser.add_argument("--num", type=int, default=16, help="samples in the grid")
    parser.add_argument("--check", type=int, default=None, help="scan only the first N samples")
    parser.add_argument("--keep-raise", action="store_true", help="keep on_bad_sample='raise'")
    args = parser.parse_args(argv)

    dataset, used = build_dataset(args.config, args.key, args.cfg_options, args.keep_raise)
    print(used)
    good, stats = scan(dataset, args.check)
    scanned = len(dataset) if args.check is None else min(args.check, len(dataset))
    print(report(dataset, good, stats, scanned))
    if good and args.num > 0:
        picks = [good[int(k)] for k in np.linspace(0, len(good) - 1, min(args.num, len(good)))]
        picks = list(dict.fromkeys(picks))
        if stats["frames"]:
            paths = draw_strips(dataset, picks, args.out)
            print(f"strips of {len(paths)} video samples written to {paths[0]} ... {paths[-1]}")
        else:
            draw_grid(dataset, picks, args.out)
            print(f"grid of {len(picks)} samples written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
