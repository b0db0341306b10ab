"""A small CNN that predicts a mask's Dice from the image and the mask alone (no ground truth at use time).

Input ``[B, C, R, R]``: the RGB image resized to R (scaled to [0, 1], centred at 0.5) and the predicted mask
area-resized to R (foreground fraction per cell), optionally plus sigmoid of the mask logits (``mask_input=
'binary+logits'``). Output: predicted Dice in (0, 1) (sigmoid). Four stride-2 conv blocks -> global average and max
pooling -> MLP, together with the mask's area fraction as an explicit scalar (small objects and empty masks are where
the Dice is most sensitive). Trained with MSE on true Dice, horizontal/vertical flips as augmentation (both leave
Dice unchanged), model selection on a validation split of *train images*.

Degenerate masks: an empty or full predicted mask is scored 0.0 without running the network (a referring target is
never empty and never the whole image; ``degenerate_value``), and counted.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

MASK_INPUTS = ("binary", "binary+logits")


@dataclass
class RewardNetConfig:
    """Architecture and input settings (saved next to the weights)."""

    side: int = 64
    mask_input: str = "binary"
    width: int = 16
    degenerate_value: float = 0.0

    def __post_init__(self) -> None:
        if self.mask_input not in MASK_INPUTS:
            raise ValueError(f"RewardNetConfig.mask_input={self.mask_input!r}: expected one of {MASK_INPUTS}")
        if self.side < 16 or self.side % 16:
            raise ValueError(f"RewardNetConfig.side={self.side}: expected a multiple of 16, >= 16 (4 stride-2 blocks)")

    @property
    def in_channels(self) -> int:
        return 4 if self.mask_input == "binary" else 5


class RewardNet(nn.Module):
    def __init__(self, config: RewardNetConfig):
        super().__init__()
        self.config = config
        w = config.width
        chans = [config.in_channels, w, 2 * w, 4 * w, 4 * w]
        self.features = nn.Sequential(*[nn.Sequential(nn.Conv2d(a, b, 3, stride=2, padding=1), nn.BatchNorm2d(b),
                                                      nn.ReLU(inplace=True)) for a, b in zip(chans[:-1], chans[1:])])
        self.head = nn.Sequential(nn.Linear(2 * chans[-1] + 1, 64), nn.ReLU(inplace=True), nn.Linear(64, 1))

    def forward(self, x: Tensor) -> Tensor:
        """x ``[B, C, R, R]`` -> Dice logit ``[B]``."""
        area = x[:, 3].mean(dim=(1, 2))[:, None]  # [B, 1] mask foreground fraction
        f = self.features(x)  # [B, 4w, R/16, R/16]
        pooled = torch.cat([f.mean(dim=(2, 3)), f.amax(dim=(2, 3)), area], dim=1)  # [B, 8w + 1]
        return self.head(pooled)[:, 0]


def resize_masks(masks: Sequence[np.ndarray] | np.ndarray, side: int) -> np.ndarray:
    """Binary masks (each ``[H, W]``, sizes may differ) -> foreground fraction ``[N, R, R]`` float32 (area pooling)."""
    out = [F.interpolate(torch.as_tensor(np.asarray(m), dtype=torch.float32)[None, None], size=(side, side),
                         mode="area")[0, 0] for m in masks]
    return torch.stack(out).numpy() if out else np.zeros((0, side, side), np.float32)


def resize_logits(logits: np.ndarray, side: int) -> np.ndarray:
    """sigmoid of low-res logits ``[N, h, w]`` bilinearly resized -> ``[N, R, R]`` float32."""
    x = torch.as_tensor(np.asarray(logits, dtype=np.float32))[:, None]
    return F.interpolate(x, size=(side, side), mode="bilinear", align_corners=False)[:, 0].sigmoid().numpy()


def make_inputs(images: np.ndarray, masks: np.ndarray, probs: np.ndarray | None = None) -> Tensor:
    """uint8 images ``[N, R, R, 3]`` + mask fractions ``[N, R, R]`` (+ probabilities) -> ``[N, C, R, R]``."""
    x = torch.from_numpy(np.array(images, dtype=np.float32)).permute(0, 3, 1, 2) / 255.0 - 0.5  # [N, 3, R, R]
    parts = [x, torch.as_tensor(masks, dtype=torch.float32)[:, None]]
    if probs is not None:
        parts.append(torch.as_tensor(probs, dtype=torch.float32)[:, None])
    return torch.cat(parts, dim=1)


def is_degenerate(mask_fraction: np.ndarray) -> np.ndarray:
    """bool ``[N]``: masks with no foreground or no background (``[N, R, R]`` fractions)."""
    flat = np.asarray(mask_fraction).reshape(len(mask_fraction), -1)
    return (flat.max(1) <= 0) | (flat.min(1) >= 1)


@torch.no_grad()
def predict_dice(net: RewardNet, inputs: Tensor, batch_size: int = 256) -> np.ndarray:
    """Predicted Dice ``[N]`` (degenerate masks get ``config.degenerate_value``)."""
    net.eval()
    scores = [torch.sigmoid(net(inputs[i:i + batch_size])) for i in range(0, len(inputs), batch_size)]
    out = torch.cat(scores).numpy().astype(np.float64) if scores else np.zeros(0)
    out[is_degenerate(inputs[:, 3].numpy())] = net.config.degenerate_value
    return out


def _flip(x: Tensor, generator: torch.Generator) -> Tensor:
    if torch.rand((), generator=generator) < 0.5:
        x = x.flip(-1)
    if torch.rand((), generator=generator) < 0.5:
        x = x.flip(-2)
    return x


def train_reward_net(config: RewardNetConfig, train_x: Tensor, train_y: np.ndarray, val_x: Tensor, val_y: np.ndarray,
                     *, epochs: int = 30, batch_size: int = 64, lr: float = 2e-3, seed: int = 0) -> tuple[RewardNet, list]:
    """MSE training on (inputs, true Dice); returns the epoch with the best validation MAE and the per-epoch log."""
    if len(train_x) < 2 or len(val_x) < 1:
        raise ValueError(f"train_reward_net: {len(train_x)} train and {len(val_x)} validation pairs; need >= 2 and >= 1")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    net = RewardNet(config)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    target = torch.as_tensor(train_y, dtype=torch.float32)
    best, best_state, log = float("inf"), None, []
    for epoch in range(epochs):
        net.train()
        order = torch.randperm(len(train_x), generator=gen)
        total = 0.0
        for b0 in range(0, len(order), batch_size):
            idx = order[b0:b0 + batch_size]
            if len(idx) < 2:  # BatchNorm needs two rows
                continue
            pred = torch.sigmoid(net(_flip(train_x[idx], gen)))
            loss = F.mse_loss(pred, target[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        val_mae = float(np.abs(predict_dice(net, val_x) - val_y).mean())
        log.append({"epoch": epoch + 1, "train_mse": round(total / len(order), 5), "val_mae": round(val_mae, 5)})
        if val_mae < best:
            best, best_state = val_mae, {k: v.clone() for k, v in net.state_dict().items()}
    net.load_state_dict(best_state)
    net.eval()
    return net, log


def save_reward_net(net: RewardNet, path: str | Path, extra: dict | None = None) -> Path:
    """``path/reward_net.pt`` (state dict) + ``path/reward_net.json`` (config + ``extra``)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), path / "reward_net.pt")
    (path / "reward_net.json").write_text(json.dumps({"config": asdict(net.config), **(extra or {})}, indent=1))
    return path


def load_reward_net(path: str | Path) -> RewardNet:
    path = Path(path)
    for name in ("reward_net.pt", "reward_net.json"):
        if not (path / name).is_file():
            raise ValueError(f"reward network {path}: missing {name}; train it with `sa2va-rl prompt-rl reward-net`")
    config = RewardNetConfig(**json.loads((path / "reward_net.json").read_text())["config"])
    net = RewardNet(config)
    net.load_state_dict(torch.load(path / "reward_net.pt", map_location="cpu", weights_only=True))
    net.eval()
    return net
