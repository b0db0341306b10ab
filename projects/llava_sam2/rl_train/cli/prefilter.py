"""``sa2va-rl prefilter CONFIG --out prompts.json``: keep the prompts whose GRPO group rewards vary.

Builds the config's model (``model``), its GRPO algorithm (``train_cfg.algorithm``: rewards, ``num_generations``,
mask policy) and its training dataset (``train_dataloader.dataset``), runs group inference once over the dataset
(G rollouts per prompt and loop, scored; no training), and writes per-prompt reward statistics and the ids of the
prompts whose rewards vary (std > ``--threshold`` in some loop; per loop too). A config then trains on those
prompts only with ``KeepIdsDataset`` (``engine/prompt_filter.py``)::

    sa2va-rl prefilter projects/llava_sam2/configs/rl/demo/grpo_shapes_cpu.py --out work_dirs/prompts.json \\
        --cfg-options train_dataloader.dataset.ann_file=work_dirs/demo/data/train/annotations.json
    sa2va-rl train CONFIG --cfg-options train_dataloader.dataset.keep_ids_file=work_dirs/prompts.json  # a config
        # whose dataset is KeepIdsDataset(dataset=..., keep_ids_file=...), e.g. configs/rl/demo/
        # grpo_shapes_prefiltered_cpu.py
"""
from __future__ import annotations

import argparse
import os
import sys

PROG = "sa2va-rl prefilter"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from mmengine.config import DictAction

    from projects.llava_sam2.rl_train.engine.prompt_filter import DEFAULT_THRESHOLD

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("config", help="the GRPO training config (model, train_cfg.algorithm, train_dataloader)")
    parser.add_argument("--out", required=True, help="output JSON (kept ids + per-prompt reward statistics)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help="keep a prompt when its group rewards' std exceeds this in some loop")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="prompts per group-inference step (default: train_dataloader.batch_size)")
    parser.add_argument("--max-prompts", type=int, default=None, help="only the first N prompts of the dataset")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: the config's randomness)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, help="key=value overrides of the config")
    return parser.parse_args(argv)


def prefilter_config(cfg, out: str, *, threshold: float, batch_size: int | None = None,
                     max_prompts: int | None = None, device: str | None = None, seed: int | None = None,
                     progress: bool = True) -> dict:
    """Group inference over ``cfg``'s training dataset and the kept ids, written to ``out``; returns the content.

    A dataset that is already a ``KeepIdsDataset`` is pre-filtered whole (its inner ``dataset``): the file
    describes the data that the config then restricts."""
    import torch
    from mmengine.registry import DATASETS, MODELS
    from mmengine.runner import set_random_seed

    import projects.llava_sam2.rl_train.engine  # noqa: F401  (registers the model)
    from projects.llava_sam2.rl_train.engine.prompt_filter import (
        KeepIdsDataset, prefilter_prompts, write_prompt_file)
    from projects.llava_sam2.rl_train.engine.registry import build_component

    seed = seed if seed is not None else int(cfg.get("randomness", {}).get("seed", 0))
    set_random_seed(seed)  # a preset's frozen weights are drawn as training draws them
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    train_model = build_component(MODELS, cfg.model).to(device)
    algorithm_cfg = dict(cfg.train_cfg.algorithm.items())
    algorithm_cfg.setdefault("seed", seed)
    algorithm = train_model.build_algorithm(algorithm_cfg)
    dataset_cfg = cfg.train_dataloader.dataset
    if dataset_cfg.get("type") in (KeepIdsDataset, "KeepIdsDataset"):
        dataset_cfg = dataset_cfg.dataset
    dataset = build_component(DATASETS, dataset_cfg)
    batch_size = batch_size or int(cfg.train_dataloader.get("batch_size", 1))
    content = prefilter_prompts(algorithm, dataset, batch_size=batch_size, threshold=threshold,
                                max_prompts=max_prompts, progress=progress)
    write_prompt_file(out, content)
    return content


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    from mmengine.config import Config

    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    content = prefilter_config(cfg, args.out, threshold=args.threshold, batch_size=args.batch_size,
                               max_prompts=args.max_prompts, device=args.device, seed=args.seed,
                               progress=not args.no_progress)
    kept, total = len(content["keep_ids"]), content["num_prompts"]
    per_loop = ", ".join(f"{loop} {len(ids)}" for loop, ids in content["keep_ids_per_loop"].items())
    print(f"{PROG}: {kept} of {total} prompts have group rewards that vary (std > {args.threshold:g}; per loop: "
          f"{per_loop}); wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
