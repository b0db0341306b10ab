"""MMEngine / XTuner glue of Sa2VA-RL: the GRPO train loop, the train model, hooks, checkpoint helpers, launch.

Importing this package registers ``GRPOLoop`` (LOOPS), ``Sa2VATrainModel`` (MODELS), ``KeepIdsDataset`` (DATASETS),
the hooks (HOOKS) and the GRPO algorithms (``registry.ALGORITHMS``), so string configs can name them too.
"""
from .hooks import (AtomicCheckpointHook, EMAPartnerHook, RewardFailureHook, RolloutLoggingHook, SkippedSampleHook,
                    TrainStateHook)
from .loop import GRPOLoop
from .prompt_filter import KeepIdsDataset
from .registry import ALGORITHMS, build_component, register_algorithms
from .train_model import Sa2VATrainModel

register_algorithms()

__all__ = [
    "ALGORITHMS", "AtomicCheckpointHook", "EMAPartnerHook", "GRPOLoop", "KeepIdsDataset", "RewardFailureHook", "RolloutLoggingHook",
    "Sa2VATrainModel", "SkippedSampleHook", "TrainStateHook", "build_component", "register_algorithms",
]
