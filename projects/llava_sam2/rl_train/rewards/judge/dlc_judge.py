"""DLC-Bench judging of predicted captions, for rewards and for evaluation.

Two ways to ask the judge:

* ``per_question`` — DLC-Bench's protocol: one request per question (recognition question first),
  with DLC-Bench's exact prompt. Use this for benchmark numbers.
* ``batched`` — one request per caption holding every question, answered as JSON letters
  (``{"answers": ["A", ...]}``). ~10x fewer requests; the same scoring, but answers are parsed
  strictly as letters (:func:`~.scoring.parse_letter`: a letter past the last choice is unparsed,
  never matched by substring). Its numbers are close to, but not the same protocol as, DLC-Bench's.

:func:`evaluate_predictions` scores a prediction file against qa.json as
``eval_model_outputs.py`` does (missing or ``"Error:"`` predictions take ``default_prediction``).
"""
from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .client import JudgeClient, JudgeError
from .prompts import batched_eval_prompt, dlc_eval_prompt, extract_json_object
from .questions import QAEntry
from .scoring import CaptionScore, questions_with_recognition, score_answers, summarize, warm_up_inflect

JUDGE_MODES = ("per_question", "batched")


def parse_batched_answers(text: str, n_questions: int) -> list[str]:
    """``{"answers": [...]}`` with exactly ``n_questions`` strings; raises ValueError otherwise."""
    obj = extract_json_object(text)
    answers = obj.get("answers") if isinstance(obj, dict) else None
    if not isinstance(answers, list) or len(answers) != n_questions:
        got = len(answers) if isinstance(answers, list) else type(answers).__name__
        raise ValueError(f"expected 'answers' with {n_questions} entries, got {got}")
    if not all(isinstance(a, str) for a in answers):
        raise ValueError("every answer must be a string (a choice letter)")
    return answers


class DLCJudge:
    """Asks a judge the questions of a :class:`QAEntry` about a predicted caption and scores them."""

    def __init__(self, client: JudgeClient, mode: str = "per_question") -> None:
        if mode not in JUDGE_MODES:
            raise ValueError(f"judge mode must be one of {JUDGE_MODES}, got {mode!r}")
        self.client = client
        self.mode = mode
        warm_up_inflect()  # inflect's import takes seconds: pay it at build time, not in a step

    async def judge(self, pred_caption: str, entry: QAEntry) -> CaptionScore:
        """DLC-Bench scores of one caption. Raises :class:`JudgeError` on transport failures and
        with cause ``unparsable`` when the recognition answer matches neither Yes nor No."""
        questions = questions_with_recognition(entry)
        if self.mode == "per_question":
            answers = await self._per_question(pred_caption, questions)
        else:
            pairs = [(q.question, q.choices) for q in questions]
            text = await self.client.complete(
                batched_eval_prompt(pred_caption, pairs),
                validate=lambda t: parse_batched_answers(t, len(questions)),
                max_tokens=max(self.client.config.max_tokens, 16 * len(questions)),
            )
            answers = parse_batched_answers(text, len(questions))
        score = score_answers(questions, answers, parser="letter" if self.mode == "batched" else "free_form")
        if score.recognition is None:
            raise JudgeError("unparsable", "recognition answer is neither Yes nor No")
        return score

    async def _per_question(self, pred_caption: str, questions) -> list[str]:
        prompts = [dlc_eval_prompt(pred_caption, q.question, q.choices) for q in questions]
        results = await asyncio.gather(*(self.client.complete(p) for p in prompts), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [r.strip() for r in results]


@dataclass
class BenchReport:
    """DLC-Bench result: per-key scores, failed keys with their cause, and the summary."""

    scores: dict[str, CaptionScore]
    failures: dict[str, str] = field(default_factory=dict)
    defaulted_keys: list[str] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "summary": self.summary,
            "failures": self.failures,
            "failure_counts": dict(Counter(self.failures.values())),
            "defaulted_keys": self.defaulted_keys,
            "scores": {k: asdict(v) for k, v in self.scores.items()},
        }


def resolve_predictions(
    predictions: Mapping[str, str], keys, default_prediction: str | None
) -> tuple[dict[str, str], list[str]]:
    """Caption per qa key; missing or ``"Error:"`` predictions take ``default_prediction``."""
    resolved, defaulted = {}, []
    for key in keys:
        caption = predictions.get(key)
        if caption is None or not isinstance(caption, str) or caption.startswith("Error:"):
            if default_prediction is None:
                raise ValueError(
                    f"prediction for key {key!r} is missing or an error ({caption!r}); "
                    "fix the prediction file or pass a default prediction"
                )
            caption = default_prediction
            defaulted.append(key)
        resolved[key] = caption
    return resolved, defaulted


async def evaluate_predictions(
    predictions: Mapping[str, str],
    qa: Mapping[str, QAEntry],
    judge: DLCJudge,
    default_prediction: str | None = None,
) -> BenchReport:
    """Score every qa key's prediction; keys whose judging failed are listed in ``failures``."""
    captions, defaulted = resolve_predictions(predictions, list(qa), default_prediction)

    async def one(key: str):
        try:
            return key, await judge.judge(captions[key], qa[key])
        except JudgeError as error:
            return key, error

    report = BenchReport(scores={}, defaulted_keys=defaulted)
    for key, outcome in await asyncio.gather(*(one(k) for k in qa)):
        if isinstance(outcome, JudgeError):
            report.failures[key] = outcome.cause
        else:
            report.scores[key] = outcome
    if report.scores:
        report.summary = summarize(report.scores)
    return report


def load_predictions(path: str | Path) -> dict[str, str]:
    """A DLC-Bench prediction file: a JSON object ``{ann_id: caption}`` (extra keys are ignored)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object {{ann_id: caption}}, got {type(data).__name__}")
    return {str(k): v for k, v in data.items()}
