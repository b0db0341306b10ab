"""``reward_net_dice``: the trained reward network as a GT-free mask reward (rewards/base.py ``Reward`` protocol).

Reads ``RewardInputs.pred_masks`` (bool ``[H, W]`` per rollout) and ``RewardInputs.images`` (PIL), never the ground
truth, and returns the network's predicted Dice per rollout. A rollout without a mask gets ``None`` (counted as
``no_mask``); empty/full masks get the network's ``degenerate_value`` (counted in ``stats['degenerate']``).
Importing this module registers the type.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..rewards.base import RewardInputs, RewardResult, check_weight, register_reward
from .quality_data import resize_image
from .reward_net import is_degenerate, load_reward_net, make_inputs, predict_dice, resize_masks


@register_reward("reward_net_dice")
class RewardNetDiceReward:
    """Predicted Dice of each rollout's mask from a ``sa2va-rl prompt-rl reward-net`` checkpoint directory.

    Args:
        checkpoint: directory holding ``reward_net.pt`` + ``reward_net.json`` (must use ``mask_input='binary'``:
            rollouts carry binary masks, not logits).
        name / weight: as every reward.
    """

    def __init__(self, checkpoint: str | Path, name: str = "reward_net_dice", weight: float = 1.0) -> None:
        self.name = name
        self.weight = check_weight(name, weight)
        self.checkpoint = str(checkpoint)
        self.net = load_reward_net(checkpoint)
        if self.net.config.mask_input != "binary":
            raise ValueError(f"reward {name!r}: {checkpoint} was trained with mask_input="
                             f"{self.net.config.mask_input!r}; GRPO rollouts only carry binary masks, so train the "
                             "reward network with --mask-input binary")

    def __call__(self, inputs: RewardInputs) -> RewardResult:
        masks = inputs.require("pred_masks", self.name)
        images = inputs.require("images", self.name)
        rows = [i for i, m in enumerate(masks) if m is not None]
        values: list[float | None] = [None] * len(inputs)
        failures = {"no_mask": len(inputs) - len(rows)} if len(rows) < len(inputs) else {}
        if not rows:
            return RewardResult(values, failures)
        side = self.net.config.side
        for i in rows:
            size = np.asarray(masks[i]).shape
            if size != (images[i].height, images[i].width):
                raise ValueError(f"reward {self.name!r}, sample {inputs.sample_ids[i]}: mask {size} != image "
                                 f"(H, W) {(images[i].height, images[i].width)}")
        fractions = resize_masks([np.asarray(masks[i], dtype=np.float32) for i in rows], side)  # [n, R, R]
        pixels = np.stack([resize_image(images[i], side) for i in rows])  # [n, R, R, 3]
        scores = predict_dice(self.net, make_inputs(pixels, fractions))
        for i, score in zip(rows, scores):
            values[i] = float(score)
        return RewardResult(values, failures, {"degenerate": float(is_degenerate(fractions).sum())})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(checkpoint={self.checkpoint!r}, name={self.name!r}, weight={self.weight})"
