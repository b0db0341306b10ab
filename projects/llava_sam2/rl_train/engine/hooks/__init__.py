"""Hooks of the GRPO engine: EMA partner, train state (RNG + side files), rollout logging, reward accounting."""
from .ema_partner import EMAPartnerHook
from .train_state import TrainStateHook

__all__ = ["EMAPartnerHook", "TrainStateHook"]
