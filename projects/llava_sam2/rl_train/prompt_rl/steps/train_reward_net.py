"""Train the mask-quality reward network on a quality cache and compare it with the free baselines.

    sa2va-rl prompt-rl reward-net CACHE OUT_DIR [--epochs 30] [--mask-input binary] [--seed 0]

Writes OUT_DIR/reward_net.pt + reward_net.json (the network; ``reward_net_dice`` loads this directory),
OUT_DIR/scores.npz (GT-free scores [I, K] of every scorer: reward_net, iou_head, stability) and
OUT_DIR/quality_model_results.json (validation metrics, held-out Pearson / Spearman / MAE / failure AUROC with
image-bootstrap CIs, the selected scorer). See prompt_rl/quality_model.py for the split rules.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from projects.llava_sam2.rl_train.prompt_rl.quality_data import load_quality_data
from projects.llava_sam2.rl_train.prompt_rl.quality_model import fit_quality_models
from projects.llava_sam2.rl_train.prompt_rl.reward_net import (
    MASK_INPUTS, RewardNetConfig, save_reward_net)

PROG = "sa2va-rl prompt-rl reward-net"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("cache", help="quality cache from `sa2va-rl prompt-rl quality-dataset`")
    parser.add_argument("out_dir", help="output directory")
    parser.add_argument("--mask-input", choices=MASK_INPUTS, default="binary",
                        help="binary mask only (usable as a GRPO reward) or binary + sigmoid(logits)")
    parser.add_argument("--epochs", type=int, default=30, help="training epochs (best validation MAE kept)")
    parser.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate")
    parser.add_argument("--width", type=int, default=16, help="channels of the first conv block")
    parser.add_argument("--val-fraction", type=float, default=0.25, help="train images used for validation")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the CIs")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, batches and the fit/val split")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1: on a shared 2-core machine 2 threads ran ~10x slower)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    data = load_quality_data(args.cache)
    config = RewardNetConfig(side=int(data.meta["image_side"]), mask_input=args.mask_input, width=args.width)
    net, scores, results = fit_quality_models(data, config, val_fraction=args.val_fraction, epochs=args.epochs,
                                              lr=args.lr, seed=args.seed, n_resamples=args.bootstrap)
    results.update(cache=str(args.cache), args=vars(args), seconds=round(time.perf_counter() - start, 1),
                   parameters=sum(p.numel() for p in net.parameters()))
    out = save_reward_net(net, args.out_dir, extra={"cache": str(args.cache), "selected_scorer":
                                                    results["selected_scorer"]})
    np.savez_compressed(out / "scores.npz", **scores)
    (out / "quality_model_results.json").write_text(json.dumps(results, indent=1))
    table = {name: {k: round(v["value"], 3) for k, v in m.items()} for name, m in results["heldout"].items()}
    print(json.dumps({"heldout": table, "selected_scorer": results["selected_scorer"], "seconds": results["seconds"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
