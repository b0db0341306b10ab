"""RolloutLoggingHook: every N iterations, what the policy produced and how it was rewarded.

At ``after_reward`` of every ``interval``-th iteration, for the first ``max_prompts`` prompts of each loop and their
first ``max_rollouts`` rollouts:

* a table row per rollout (iteration, loop, sample id, prompt, completion, reward), printed to the log and appended
  to ``<log_dir>/rollouts.jsonl``;
* one PNG panel per prompt through ``runner.visualizer.add_image`` (so the Local, TensorBoard and W&B backends all
  get it): the image with the gt mask (green), then one tile per rollout with its reward and caption, and, where
  the rollout's action is a binary mask grid (loop 2 with the bernoulli mask policy), that mask in red.

Captions are decoded with the train model's ``processor.tokenizer`` when it has one (token ids otherwise).
"""
from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import torch
from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from PIL import Image, ImageDraw

from ...grpo.rollout import CaptionReplay, MaskReplay
from ..checkpointing import unwrap_model
from ..stats import loop_names

GT_COLOR, PRED_COLOR = (0, 200, 0), (230, 30, 30)


def overlay(image: Image.Image, mask: np.ndarray | None, color: tuple[int, int, int], size: int) -> Image.Image:
    """``image`` resized to fit ``size`` with ``mask`` (bool, any resolution) blended in ``color`` at 45%."""
    scale = size / max(image.size)
    tile = image.convert("RGB").resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))))
    if mask is not None:
        mask_img = Image.fromarray(np.asarray(mask, dtype=np.uint8) * 255).resize(tile.size, Image.NEAREST)
        tint = Image.new("RGB", tile.size, color)
        tile = Image.composite(Image.blend(tile, tint, 0.45), tile, mask_img)
    return tile


def caption_strip(tile: Image.Image, text: str, lines: int = 3) -> Image.Image:
    """``tile`` with ``text`` wrapped into a white strip below it."""
    width = max(8, tile.width // 6)
    wrapped = textwrap.wrap(text, width) or [""]
    if len(wrapped) > lines:  # mark the cut (the reward leads the text, so it is never the part cut)
        wrapped = wrapped[:lines - 1] + [wrapped[lines - 1][:width - 3] + "..."]  # ASCII: PIL's bitmap font
    strip_h = 12 * len(wrapped) + 4
    out = Image.new("RGB", (tile.width, tile.height + strip_h), (255, 255, 255))
    out.paste(tile, (0, 0))
    ImageDraw.Draw(out).multiline_text((2, tile.height + 2), "\n".join(wrapped), fill=(0, 0, 0), spacing=2)
    return out


def hstack(tiles: list[Image.Image]) -> np.ndarray:
    """Tiles side by side (top-aligned, white background) as uint8 ``[H, W, 3]`` RGB."""
    height, width = max(t.height for t in tiles), sum(t.width for t in tiles)
    panel, x = Image.new("RGB", (width, height), (255, 255, 255)), 0
    for tile in tiles:
        panel.paste(tile, (x, 0))
        x += tile.width
    return np.asarray(panel)


class RolloutDecoder:
    """Prompt, completion and (binary) mask of rollout ``n``, for display."""

    def __init__(self, tokenizer=None) -> None:
        self.tokenizer = tokenizer

    def text(self, ids: torch.Tensor) -> str:
        ids = [int(i) for i in ids]
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()

    def prompt(self, rollout, n: int) -> str:
        replay = rollout.replay
        return self.text(replay.prompt_ids[n][replay.prompt_attention[n].bool()])[-200:]

    def completion(self, rollout, n: int) -> str:
        replay = rollout.replay
        if isinstance(replay, CaptionReplay):
            return self.text(replay.completion_ids[n][rollout.action_mask[n]])
        grid = self.mask(rollout, n)
        return "<mask action>" if grid is None else f"<mask: {int(grid.sum())} of {grid.size} cells>"

    @staticmethod
    def mask(rollout, n: int) -> np.ndarray | None:
        """The sampled mask grid of a binary mask action, else None."""
        action = getattr(rollout.replay, "action", None)
        if isinstance(rollout.replay, MaskReplay) and action is not None and action.dtype == torch.bool \
                and action.dim() == 3:
            return action[n].cpu().numpy()
        return None


def loop_samples(data_batch, loop: str) -> list:
    """The batch's samples that ``loop`` ran on, in its prompt order: with unpaired data each loop has its own
    (``grpo.features.LOOP_NEEDS``); samples that are not ``RegionSample``-like are all kept."""
    from ...grpo.features import LOOP_NEEDS

    samples = list(data_batch or [])
    needs = LOOP_NEEDS.get(loop)
    if needs is None or not all((hasattr(s, "gt_mask") or hasattr(s, "gt_masks")) and hasattr(s, "captions")
                                for s in samples):
        return samples
    return [s for s in samples if needs(s)]


@HOOKS.register_module()
class RolloutLoggingHook(Hook):
    """Log a table of rollouts and PNG overlays every ``interval`` iterations (and at the first one).

    Args:
        interval: iterations between two logs.
        max_prompts: prompts shown per loop.
        max_rollouts: rollouts shown per prompt.
        tile_size: longest side of each image tile in the PNG panels, in pixels.
    """

    priority = "LOW"

    def __init__(self, interval: int = 50, max_prompts: int = 4, max_rollouts: int = 4, tile_size: int = 224):
        for name, value in (("interval", interval), ("max_prompts", max_prompts), ("max_rollouts", max_rollouts),
                            ("tile_size", tile_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"RolloutLoggingHook: {name}={value!r}; it must be a positive integer.")
        self.interval, self.max_prompts = interval, max_prompts
        self.max_rollouts, self.tile_size = max_rollouts, tile_size

    def after_reward(self, runner, batch_idx: int, data_batch=None, rollouts=()) -> None:
        if not (batch_idx == 0 or self.every_n_train_iters(runner, self.interval)) or not is_main_process():
            return
        decoder = RolloutDecoder(getattr(getattr(unwrap_model(runner.model), "processor", None), "tokenizer", None))
        rows = []
        for loop, rollout in zip(loop_names(rollouts), rollouts):
            samples = loop_samples(data_batch, loop)
            for b in range(min(rollout.num_prompts, self.max_prompts)):
                sample = samples[b] if b < len(samples) else None
                loop_rows = self._rows(batch_idx, loop, rollout, b, sample, decoder)
                rows.extend(loop_rows)
                if getattr(sample, "image", None) is not None:
                    runner.visualizer.add_image(f"rollouts_{loop}_{b}", self._panel(sample, rollout, b, loop_rows,
                                                                                     decoder), step=batch_idx + 1)
        self._write_table(runner, rows)

    def _rows(self, batch_idx: int, loop: str, rollout, b: int, sample, decoder: RolloutDecoder) -> list[dict]:
        G = rollout.group_size
        sample_id = getattr(sample, "sample_id", None) or (sample.get("sample_id") if isinstance(sample, dict)
                                                           else None)
        return [dict(iter=batch_idx + 1, loop=loop, sample_id=sample_id, rollout=g,
                     prompt=decoder.prompt(rollout, b * G + g), completion=decoder.completion(rollout, b * G + g),
                     reward=float(rollout.rewards[b, g])) for g in range(min(G, self.max_rollouts))]

    def _panel(self, sample, rollout, b: int, rows: list[dict], decoder: RolloutDecoder) -> np.ndarray:
        tiles = [caption_strip(overlay(sample.image, sample.gt_mask, GT_COLOR, self.tile_size),
                               f"{rows[0]['sample_id']}: gt")]
        for row in rows:
            mask = decoder.mask(rollout, b * rollout.group_size + row["rollout"])
            tile = overlay(sample.image, mask, PRED_COLOR, self.tile_size)
            tiles.append(caption_strip(tile, f"r={row['reward']:.3f} {row['completion']}"))
        return hstack(tiles)

    @staticmethod
    def _write_table(runner, rows: list[dict]) -> None:
        if not rows:
            return
        lines = [f"{r['loop']} {r['sample_id']} #{r['rollout']} r={r['reward']:.3f} | {r['completion'][:80]}"
                 for r in rows]
        runner.logger.info(f"rollouts at iteration {rows[0]['iter']}:\n" + "\n".join(lines))
        with open(os.path.join(runner.log_dir, "rollouts.jsonl"), "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
