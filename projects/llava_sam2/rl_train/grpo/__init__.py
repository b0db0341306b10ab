"""GRPO math for the dual-loop trainer, framework-free (no MMEngine): config, rollout hand-off, advantages,
the clipped loss and its normalisations, stochastic mask policies, and the policy / partner / reference
weight sets. The two loops that call the model live in ``cycle.py``; the seam the engine drives is ``protocol.py``;
MMEngine glue lives in ``engine/``."""
from .advantages import SCALE_REWARDS, group_advantages, rewards_to_tensor
from .config import GRPOConfig
from .losses import LOSS_AGGREGATIONS, PolicyLoss, clipped_objective, kl_k3, masked_mean
from .mask_policy import MASK_POLICIES, MaskHead, MaskPolicy, build_mask_policy
from .protocol import GRPOAlgorithm, GRPOTrainModel, check_algorithm
from .rollout import AdvantagedStep, CaptionReplay, MaskReplay, Rollout, SampledStep, ScoredStep
from .weights import WeightSetMemory, WeightSets, is_lora_tensor, mmengine_momentum

__all__ = [
    "SCALE_REWARDS", "group_advantages", "rewards_to_tensor",
    "GRPOConfig",
    "LOSS_AGGREGATIONS", "PolicyLoss", "clipped_objective", "kl_k3", "masked_mean",
    "MASK_POLICIES", "MaskHead", "MaskPolicy", "build_mask_policy",
    "GRPOAlgorithm", "GRPOTrainModel", "check_algorithm",
    "AdvantagedStep", "CaptionReplay", "MaskReplay", "Rollout", "SampledStep", "ScoredStep",
    "WeightSetMemory", "WeightSets", "is_lora_tensor", "mmengine_momentum",
]
