"""Rewards: mask metrics, METEOR (nltk reward / METEOR 1.5 evaluation), the LLM judge and the
weighted composer. Importing this package registers every reward type in ``REWARDS``
(``iou``, ``dice``, ``meteor``, ``dlc_judge``, ``video_jf``). No MMEngine here: ``engine/`` mirrors the registry.
"""
from .async_runner import AsyncRunner, default_runner
from .base import REWARDS, Reward, RewardInputs, RewardResult, build_reward, register_reward
from .composer import MISSING_POLICIES, RewardComposer, combine
from .judge import DLCJudgeReward, JudgeClient, JudgeConfig, JudgeError
from .mask_metrics import (
    DiceReward,
    IoUReward,
    SegmentationAccumulator,
    ciou_giou,
    mask_counts,
    mask_dice,
    mask_iou,
    mask_metrics,
    mask_precision,
    mask_recall,
)
from .meteor import MeteorReward, WordNetMissingError, ensure_wordnet, meteor_nltk, tokenize_for_meteor
from .video_metrics import VideoJFReward

__all__ = [
    "AsyncRunner", "DLCJudgeReward", "DiceReward", "IoUReward", "JudgeClient", "JudgeConfig",
    "JudgeError", "MISSING_POLICIES", "MeteorReward", "REWARDS", "Reward", "RewardComposer",
    "RewardInputs", "RewardResult", "SegmentationAccumulator", "WordNetMissingError", "build_reward",
    "ciou_giou", "combine", "default_runner", "ensure_wordnet", "mask_counts", "mask_dice", "mask_iou",
    "mask_metrics", "mask_precision", "mask_recall", "meteor_nltk", "register_reward",
    "tokenize_for_meteor", "VideoJFReward",
]
