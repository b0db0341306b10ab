"""Held-out evaluation of one Sa2VA system: RES (cIoU/gIoU), region caption (METEOR), Loop-1 cycle IoU and
Loop-2 cycle METEOR, with bootstrap 95% CIs; writes ``OUT/metrics.json`` and ``OUT/records/<task>.jsonl``.

    # an HF-layout checkpoint (released Sa2VA, or an exported RL result) on the shapes world
    sa2va-rl evaluate --checkpoint work_dirs/tiny_ckpt --dataset shapes --split val --num-samples 200 \\
        --out work_dirs/eval/base --system base
    # a preset with seeded random weights (+ optional weights file on top)
    sa2va-rl evaluate --preset tiny --init-seed 0 --weights model.safetensors --dataset shapes ...
    # an MMEngine RL checkpoint through its training config (LoRA kept wrapped)
    sa2va-rl evaluate --config projects/llava_sam2/configs/rl/tiny_grpo_cycle_cpu.py \\
        --weights work_dirs/tiny_grpo/iter_4.pth --dataset shapes ...
    # a COCO-style annotations.json (captions / expressions per annotation)
    sa2va-rl evaluate --checkpoint DIR --dataset coco --ann-file data/val/annotations.json ...
    # the video cycle tasks on MeViS-layout clips (every frame of each clip)
    sa2va-rl evaluate --checkpoint DIR --dataset mevis --expression-file meta_expressions.json \
        --mask-file mask_dict.json --image-root JPEGImages --tasks video_cycle_jf video_cycle_caption ...

Compare systems with ``sa2va-rl report``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from projects.llava_sam2.rl_train.evaluation.loading import load_system, read_state_dict
from projects.llava_sam2.rl_train.evaluation.metrics import TASKS, VIDEO_TASKS
from projects.llava_sam2.rl_train.evaluation.results import build_dataset, save_run
from projects.llava_sam2.rl_train.evaluation.tasks import EvalConfig, config_dict, evaluate
from projects.llava_sam2.rl_train.evaluation.video_cycle_tasks import evaluate_video
from projects.llava_sam2.rl_train.model.checkpoints.dtypes import DTYPES, as_torch_dtype

PROG = "sa2va-rl evaluate"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    source = parser.add_argument_group("system under test (model A)")
    which = source.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", help="HF-layout Sa2VA checkpoint directory")
    which.add_argument("--preset", help="size preset with seeded random weights (tiny/1b/4b/8b)")
    which.add_argument("--config", help="MMEngine training config; --weights is then its .pth checkpoint")
    source.add_argument("--weights", help="weights file laid over the model (see evaluation/loading.py)")
    source.add_argument("--init-seed", type=int, default=0, help="torch seed of a preset's random init")
    source.add_argument("--tokenizer", help="tokenizer directory (default: the checkpoint's / the tiny one)")
    source.add_argument("--partner-checkpoint", help="model B of the cycle tasks (default: model A itself)")
    source.add_argument("--system", default=None, help="name of this system in reports (default: OUT's name)")
    source.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    source.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="weight dtype (default: checkpoint's)")
    data = parser.add_argument_group("held-out data")
    data.add_argument("--dataset", choices=("shapes", "coco", "mevis"), default="shapes",
                      help="mevis: clips in MeViS's layout, for the video tasks")
    data.add_argument("--split", default="val", help="shapes split (val/test are held out from train)")
    data.add_argument("--num-samples", type=int, default=200, help="samples to evaluate (shapes: split size)")
    data.add_argument("--data-seed", type=int, default=0, help="shapes world seed")
    data.add_argument("--image-size", type=int, default=224, help="shapes image side in pixels")
    data.add_argument("--domain", choices=("source", "target"), default="source",
                      help="shapes domain: the pretraining pixels or the shifted target pixels (same scenes)")
    data.add_argument("--shift", type=float, default=1.0, help="strength of the target domain's pixel shift")
    data.add_argument("--ann-file", help="COCO-style annotations.json (--dataset coco)")
    data.add_argument("--image-root", help="folder that file_name is relative to (default: the json's folder)")
    data.add_argument("--name", default="coco", help="dataset name used in sample ids (--dataset coco / mevis)")
    data.add_argument("--expression-file", help="MeViS meta_expressions.json (--dataset mevis)")
    data.add_argument("--mask-file", help="MeViS mask_dict.json (--dataset mevis)")
    run = parser.add_argument_group("evaluation")
    run.add_argument("--tasks", nargs="+", choices=TASKS + VIDEO_TASKS, default=None,
                     help=f"default: {' '.join(TASKS)} (image data) or {' '.join(VIDEO_TASKS)} (--dataset mevis)")
    run.add_argument("--video-mllm-frames", type=int, default=5,
                     help="video tasks: frames of each clip the language model sees (upstream: 5)")
    run.add_argument("--out", required=True, help="output directory (metrics.json, records/)")
    run.add_argument("--batch-size", type=int, default=8)
    run.add_argument("--max-new-tokens", type=int, default=64)
    run.add_argument("--multi-seg", choices=("first", "union"), default="first")
    run.add_argument("--caption-cleaning", choices=("sa2va", "tags"), default="sa2va")
    run.add_argument("--empty-region", default="dilate_to_one_cell", help="processor empty-region policy")
    run.add_argument("--meteor15", action="store_true", help="also score METEOR 1.5 with the Java jar")
    run.add_argument("--n-resamples", type=int, default=1000, help="bootstrap resamples")
    run.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    run.add_argument("--no-progress", action="store_true")
    return parser.parse_args(argv)


def dataset_spec(args: argparse.Namespace) -> dict:
    if args.dataset == "shapes":
        return {"kind": "shapes", "split": args.split, "seed": args.data_seed, "num_samples": args.num_samples,
                "image_size": args.image_size, "domain": args.domain, "shift": args.shift}
    if args.dataset == "mevis":
        if not (args.expression_file and args.mask_file and args.image_root):
            raise SystemExit("--dataset mevis needs --expression-file, --mask-file and --image-root")
        return {"kind": "mevis", "expression_file": args.expression_file, "mask_file": args.mask_file,
                "image_root": args.image_root, "name": args.name, "num_samples": args.num_samples}
    if not args.ann_file:
        raise SystemExit("--dataset coco needs --ann-file path/to/annotations.json")
    return {"kind": "coco", "ann_file": args.ann_file, "image_root": args.image_root, "name": args.name,
            "num_samples": args.num_samples}


def load_from_config(config: str, weights: str | None, device: str):
    """Build the training model of an MMEngine config, load its checkpoint; (Sa2VAModel, processor, meta).

    Frozen tensors are not in RL checkpoints: they come from the config's ``pretrained_path``, or for a preset
    from a random init seeded with the config's ``randomness.seed`` (exact only if training built the model
    the same way; prefer a pretrained_path such as ``sa2va-rl setup tiny-checkpoint`` writes).
    """
    import projects.llava_sam2.rl_train.engine  # noqa: F401  (registers the model)
    from mmengine.config import Config
    from mmengine.registry import MODELS
    from mmengine.runner import set_random_seed

    cfg = Config.fromfile(config)
    set_random_seed(int(cfg.get("randomness", {}).get("seed", 0)))
    train_model = MODELS.build(cfg.model)
    source = f"config {config}"
    if weights is not None:
        result = train_model.load_state_dict(read_state_dict(weights), strict=False)
        if result.unexpected_keys:
            raise SystemExit(f"{weights}: keys not in the model of {config}, e.g. {result.unexpected_keys[:3]}")
        source += f" + {weights}"
    sa2va = train_model.sa2va.to(device).eval()
    return sa2va, train_model.processor, {"source": source}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec = dataset_spec(args)  # data and task checks first: they stop before the model loads
    is_video = spec["kind"] == "mevis"
    tasks = args.tasks or list(VIDEO_TASKS if is_video else TASKS)
    wrong = [t for t in tasks if (t in VIDEO_TASKS) != is_video]
    if wrong:
        raise SystemExit(f"--tasks {' '.join(wrong)}: {'image' if is_video else 'video'} tasks do not run on "
                         f"--dataset {args.dataset}; video tasks ({' '.join(VIDEO_TASKS)}) need --dataset mevis")
    dtype = as_torch_dtype(args.dtype, "--dtype")
    overrides = {"empty_region": args.empty_region}
    if args.config:
        model, processor, meta = load_from_config(args.config, args.weights, args.device)
    else:
        model, processor, meta = load_system(checkpoint=args.checkpoint, preset=args.preset, weights=args.weights,
                                             init_seed=args.init_seed, tokenizer=args.tokenizer, device=args.device,
                                             torch_dtype=dtype, processor_overrides=overrides)
    model_b = processor_b = None
    if args.partner_checkpoint:
        model_b, processor_b, partner = load_system(checkpoint=args.partner_checkpoint, device=args.device,
                                                    torch_dtype=dtype, processor_overrides=overrides)
        meta["partner"] = partner["source"]
    config = EvalConfig(batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, multi_seg=args.multi_seg,
                        video_mllm_frames=args.video_mllm_frames,
                        caption_cleaning=args.caption_cleaning, empty_region=args.empty_region,
                        use_meteor15=args.meteor15, n_resamples=args.n_resamples, seed=args.seed,
                        show_progress=not args.no_progress)
    run = evaluate_video if is_video else evaluate
    results = run(model, processor, build_dataset(spec), tasks, config, model_b=model_b, processor_b=processor_b,
                  num_samples=args.num_samples)
    system = args.system or Path(args.out).name
    path = save_run(args.out, results, {"system": system, "model": meta, "dataset": spec,
                                        "config": config_dict(config)})
    for task, result in results.items():
        print(f"{task} (n={len(result.records)}): " + ", ".join(f"{k} {v.format()}" for k, v in result.metrics.items()))
        if result.meteor15_corpus is not None:
            print(f"{task}: METEOR15_corpus {result.meteor15_corpus:.3f}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
