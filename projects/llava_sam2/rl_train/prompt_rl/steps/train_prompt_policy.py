"""Prompt selection on a quality cache: PPO and LinUCB policies next to fixed-prompt, reranking and oracle choices.

    sa2va-rl prompt-rl policy CACHE REWARD_DIR OUT_DIR [--scorer selected] [--timesteps 10000]

Policies learn on the cache's train images only, from a GT-free reward (``--scorer``: the scorer that
the reward-net step selected on validation by default, or reward_net / iou_head / stability); a PPO run on the true
Dice (``ppo_gt_reward``) shows what these image features allow at best. Every method is evaluated on the same
held-out images: default prompt, best fixed prompt (by train Dice, and by train score), quality reranking (run all K
prompts, keep the best-scored mask), PPO, LinUCB, random, and the per-image oracle. Writes
OUT_DIR/prompt_policy_results.json (Dice / IoU / recall / precision with bootstrap CIs, paired differences).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from projects.llava_sam2.rl_train.prompt_rl.bandit import train_linucb
from projects.llava_sam2.rl_train.prompt_rl.env import FeatureMap
from projects.llava_sam2.rl_train.prompt_rl.policy import policy_choice, train_ppo
from projects.llava_sam2.rl_train.prompt_rl.quality_data import load_quality_data
from projects.llava_sam2.rl_train.prompt_rl.selection import (
    argmax_choice, best_fixed_prompt, summarize_methods)

PROG = "sa2va-rl prompt-rl policy"


def load_scores(reward_dir: str, data) -> tuple[dict[str, np.ndarray], str]:
    path = Path(reward_dir)
    for name in ("scores.npz", "quality_model_results.json"):
        if not (path / name).is_file():
            raise ValueError(f"{path}: missing {name}; run `sa2va-rl prompt-rl reward-net` on the same cache first")
    with np.load(path / "scores.npz") as npz:
        scores = {k: npz[k] for k in npz.files}
    for name, s in scores.items():
        if s.shape != data.dice.shape:
            raise ValueError(f"{path / 'scores.npz'}: {name} has shape {s.shape} but the cache is {data.dice.shape}; "
                             "were the scores computed on another cache?")
    return scores, json.loads((path / "quality_model_results.json").read_text())["selected_scorer"]


def choices_for(data, scores: dict, scorer: str, args) -> tuple[dict[str, np.ndarray], dict]:
    train, held = data.split_indices("train"), data.split_indices("heldout")
    features = FeatureMap(data.image_features[train], dim=args.feature_dim)
    s_train, s_held = features(data.image_features[train]), features(data.image_features[held])
    reward = scores[scorer][train]
    ppo, ppo_stats = train_ppo(s_train, reward, args.timesteps, seed=args.seed)
    ppo_gt, ppo_gt_stats = train_ppo(s_train, data.dice[train], args.timesteps, seed=args.seed)
    start = time.perf_counter()
    bandit = train_linucb(s_train, reward, args.timesteps, alpha=args.linucb_alpha, seed=args.seed)
    linucb_seconds = time.perf_counter() - start
    n = len(held)
    choices = {
        "default": np.zeros(n, dtype=np.int64),
        "best_fixed": np.full(n, best_fixed_prompt(data, train)),
        "best_fixed_by_score": np.full(n, int(np.argmax(reward.mean(0)))),
        "random": np.random.default_rng(args.seed).integers(data.num_prompts, size=n),
        f"ppo[{scorer}]": policy_choice(ppo, s_held),
        f"linucb[{scorer}]": np.array([bandit.act(s, explore=False) for s in s_held]),
        "ppo[gt_dice]": policy_choice(ppo_gt, s_held),
        **{f"rerank[{name}]": argmax_choice(s[held]) for name, s in scores.items()},
        "oracle": argmax_choice(data.dice[held]),
    }
    stats = {"ppo": ppo_stats, "ppo_gt_reward": ppo_gt_stats, "linucb_seconds": round(linucb_seconds, 2),
             "feature_dim": features.dim, "train_images": len(train), "heldout_images": n}
    return choices, stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("cache", help="quality cache")
    parser.add_argument("reward_dir", help="output directory of `sa2va-rl prompt-rl reward-net` for the same cache")
    parser.add_argument("out_dir", help="output directory")
    parser.add_argument("--scorer", default="selected",
                        help="GT-free reward of the policies: selected | reward_net | iou_head | stability")
    parser.add_argument("--timesteps", type=int, default=5000, help="PPO timesteps = LinUCB rounds")
    parser.add_argument("--feature-dim", type=int, default=16, help="PCA dimensions of the image state")
    parser.add_argument("--linucb-alpha", type=float, default=0.5, help="LinUCB exploration width")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0, help="seed of PPO, LinUCB and the random baseline")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    data = load_quality_data(args.cache)
    scores, selected = load_scores(args.reward_dir, data)
    scorer = selected if args.scorer == "selected" else args.scorer
    if scorer not in scores:
        parser.error(f"--scorer {scorer!r}: expected one of {sorted(scores)} or 'selected'")
    choices, stats = choices_for(data, scores, scorer, args)
    summary = summarize_methods(data, data.split_indices("heldout"), choices, n_resamples=args.bootstrap,
                                seed=args.seed)
    results = {"cache": str(args.cache), "reward_scorer": scorer, "prompt_labels": data.meta["prompt_labels"],
               "methods": summary, "stats": stats, "args": vars(args),
               "seconds": round(time.perf_counter() - start, 1)}
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "prompt_policy_results.json").write_text(json.dumps(results, indent=1))
    print(json.dumps({name: round(m["dice"]["value"], 4) for name, m in summary.items()}))
    print(json.dumps({"ppo_steps_per_second": stats["ppo"]["steps_per_second"], "seconds": results["seconds"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
