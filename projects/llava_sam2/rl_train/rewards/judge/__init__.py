"""LLM judge (DLC-Bench style): async client, cache, question generation, scoring, reward."""
from .cache import ResponseCache
from .client import DEFAULT_JUDGE_MODEL, JudgeClient, JudgeConfig, JudgeError
from .dlc_judge import JUDGE_MODES, BenchReport, DLCJudge, evaluate_predictions, load_predictions
from .questions import QAEntry, Question, QuestionGenerator, load_qa, save_qa, validate_generated
from .reward import DLCJudgeReward
from .scoring import CaptionScore, parse_answer, parse_letter, recognition_question, score_answers, summarize

__all__ = [
    "BenchReport", "CaptionScore", "DEFAULT_JUDGE_MODEL", "DLCJudge", "DLCJudgeReward", "JUDGE_MODES",
    "JudgeClient", "JudgeConfig", "JudgeError", "QAEntry", "Question", "QuestionGenerator",
    "ResponseCache", "evaluate_predictions", "load_predictions", "load_qa", "parse_answer", "parse_letter",
    "recognition_question", "save_qa", "score_answers", "summarize", "validate_generated",
]
