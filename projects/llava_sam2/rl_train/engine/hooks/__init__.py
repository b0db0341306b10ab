"""Hooks of the GRPO engine: crash-safe checkpoints, EMA partner, train state (RNG + side files), rollout logging,
reward and bad-sample accounting."""
from .checkpoint import AtomicCheckpointHook
from .data_hooks import SkippedSampleHook
from .ema_partner import EMAPartnerHook
from .reward_hooks import RewardFailureHook
from .rollout_logging import RolloutLoggingHook
from .train_state import TrainStateHook

__all__ = ["AtomicCheckpointHook", "EMAPartnerHook", "RewardFailureHook", "RolloutLoggingHook", "SkippedSampleHook",
           "TrainStateHook"]
