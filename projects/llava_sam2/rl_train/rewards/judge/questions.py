"""DLC-Bench question records: types, qa.json I/O, strict validation, and LLM question generation.

qa.json layout (DLC-Bench): ``{key: [question, ...]}``, positives first, then negatives, each
``{"question": str, "choices": [[text, score], ...], "type": "positive"|"negative"}`` plus
``"subtype": "salient negative"|"negative part"`` on negatives. class_names.json: ``{key: name}``.

Generated questions (from a ground-truth caption) are validated more strictly than loaded ones,
because they come from an LLM: see :func:`validate_generated`.
"""
from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .prompts import extract_json_object, question_generation_prompt

QUESTION_TYPES = ("positive", "negative")
NEGATIVE_SUBTYPES = ("salient negative", "negative part")
MAX_CHOICES = 5  # DLC-Bench labels choices A-E
MAX_GENERATED_PER_TYPE = 8


@dataclass(frozen=True)
class Question:
    """One multiple-choice question; ``choices`` are ``(text, score)`` pairs.

    Scores are floats for positive/negative questions and the strings ``"correct"`` /
    ``"incorrect"`` for DLC-Bench's recognition question.
    """

    question: str
    choices: tuple[tuple[str, Any], ...]
    type: str
    subtype: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "question": self.question,
            "choices": [[text, score] for text, score in self.choices],
            "type": self.type,
        }
        if self.subtype is not None:
            out["subtype"] = self.subtype
        return out


@dataclass(frozen=True)
class QAEntry:
    """The questions of one region: its class name (for the recognition question) and its
    positive and negative questions in qa.json order."""

    class_name: str
    questions: tuple[Question, ...]


def _score(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: choice score must be a finite number, got {value!r}")
    return float(value)


def question_from_json(item: Any, where: str) -> Question:
    """Parse one qa.json question dict; raise ValueError naming ``where`` on a bad layout."""
    if not isinstance(item, dict):
        raise ValueError(f"{where}: question must be an object, got {type(item).__name__}")
    text, choices, kind = item.get("question"), item.get("choices"), item.get("type")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: 'question' must be a non-empty string, got {text!r}")
    if kind not in QUESTION_TYPES:
        raise ValueError(f"{where}: 'type' must be one of {QUESTION_TYPES}, got {kind!r}")
    if not isinstance(choices, list) or not 2 <= len(choices) <= MAX_CHOICES:
        raise ValueError(f"{where}: 'choices' must be a list of 2..{MAX_CHOICES} [text, score] pairs")
    parsed = []
    for j, choice in enumerate(choices):
        if not (isinstance(choice, (list, tuple)) and len(choice) == 2 and isinstance(choice[0], str)):
            raise ValueError(f"{where}: choice {j} must be [text, score], got {choice!r}")
        if not choice[0].strip():
            raise ValueError(f"{where}: choice {j} has empty text")
        parsed.append((choice[0], _score(choice[1], f"{where} choice {j}")))
    subtype = item.get("subtype")
    if kind == "negative" and subtype is not None and subtype not in NEGATIVE_SUBTYPES:
        raise ValueError(f"{where}: negative 'subtype' must be one of {NEGATIVE_SUBTYPES}, got {subtype!r}")
    return Question(question=text, choices=tuple(parsed), type=kind, subtype=subtype)


def entry_from_json(class_name: Any, items: Any, where: str) -> QAEntry:
    """One qa.json value plus its class name -> :class:`QAEntry` (needs >= 1 positive question)."""
    if not isinstance(class_name, str) or not class_name.strip():
        raise ValueError(f"{where}: class name must be a non-empty string, got {class_name!r}")
    if not isinstance(items, list):
        raise ValueError(f"{where}: expected a list of questions, got {type(items).__name__}")
    questions = tuple(question_from_json(item, f"{where} question {i}") for i, item in enumerate(items))
    if not any(q.type == "positive" for q in questions):
        raise ValueError(f"{where}: needs at least one positive question (the score divides by their count)")
    return QAEntry(class_name=class_name.strip(), questions=questions)


def load_qa(qa_path: str | Path, class_names_path: str | Path) -> dict[str, QAEntry]:
    """Read DLC-Bench's qa.json + class_names.json into ``{key: QAEntry}``."""
    qa = json.loads(Path(qa_path).read_text())
    names = json.loads(Path(class_names_path).read_text())
    if not isinstance(qa, dict) or not isinstance(names, dict):
        raise ValueError(f"{qa_path} and {class_names_path} must each hold a JSON object keyed by region id")
    missing = [key for key in qa if key not in names]
    if missing:
        raise ValueError(f"{class_names_path} has no class name for {len(missing)} keys of {qa_path}, e.g. {missing[:3]}")
    return {key: entry_from_json(names[key], items, f"{qa_path} key {key!r}") for key, items in qa.items()}


def save_qa(entries: dict[str, QAEntry], qa_path: str | Path, class_names_path: str | Path) -> None:
    """Write ``{key: QAEntry}`` as qa.json + class_names.json (DLC-Bench layout)."""
    Path(qa_path).write_text(json.dumps({k: [q.to_json() for q in e.questions] for k, e in entries.items()}, indent=1))
    Path(class_names_path).write_text(json.dumps({k: e.class_name for k, e in entries.items()}, indent=1))


def _check_generated_question(question: Question, where: str) -> None:
    """The DLC-Bench choice-score patterns (docs/rewards.md, "Questions for training captions")."""
    scores = Counter(score for _, score in question.choices)
    if question.type == "positive":
        ok = len(question.choices) == 4 and scores[1.0] == 1 and scores[-1.0] == 1 and set(scores) <= {1.0, 0.5, 0.0, -1.0}
        expected = "4 choices scored 1, -1 and two of {0.5, 0} (e.g. 1, 0.5, 0, -1)"
    elif question.subtype == "salient negative":
        ok, expected = scores == Counter({1.0: 1, -1.0: 1}), "2 choices scored 1 and -1"
    elif question.subtype == "negative part":
        ok, expected = scores == Counter({1.0: 1, -1.0: 1, 0.0: 1}), "3 choices scored 1, -1 and 0"
    else:
        ok, expected = False, f"a negative 'subtype' in {NEGATIVE_SUBTYPES}"
    if not ok:
        raise ValueError(f"{where}: expected {expected}, got {[s for _, s in question.choices]}")


def validate_generated(obj: Any, where: str = "generated questions") -> QAEntry:
    """Strictly validate an LLM's question JSON ``{"class_name", "positive": [...], "negative": [...]}``.

    Raises ValueError (counted as ``unparsable``) unless: class_name is a non-empty string;
    1..8 positive questions with DLC-Bench's 4-choice score pattern; 0..8 negatives with a
    subtype and its score pattern.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    extra = set(obj) - {"class_name", "positive", "negative"}
    if extra:
        raise ValueError(f"{where}: unexpected keys {sorted(extra)}")
    questions = []
    for kind in QUESTION_TYPES:
        items = obj.get(kind, [])
        if not isinstance(items, list) or len(items) > MAX_GENERATED_PER_TYPE:
            raise ValueError(f"{where}: {kind!r} must be a list of at most {MAX_GENERATED_PER_TYPE} questions")
        for i, item in enumerate(items):
            item = dict(item, type=kind) if isinstance(item, dict) else item
            question = question_from_json(item, f"{where} {kind} {i}")
            _check_generated_question(question, f"{where} {kind} {i}")
            questions.append(question)
    return entry_from_json(obj.get("class_name"), [q.to_json() for q in questions], where)


def parse_generated(text: str) -> QAEntry:
    """Reply text -> validated :class:`QAEntry`; raises ValueError when it is not acceptable."""
    return validate_generated(extract_json_object(text))


class QuestionGenerator:
    """Generates (and memoises) a :class:`QAEntry` per ground-truth caption through a judge client.

    The client's on-disk cache is keyed by (model, prompt), so a caption's questions are asked
    for once across runs; ``sa2va-rl judge questions`` fills it for a whole dataset.
    Only replies that pass :func:`parse_generated` are cached.
    """

    def __init__(self, client, max_tokens: int = 1024) -> None:
        self.client = client
        self.max_tokens = max_tokens
        self._memo: dict[str, QAEntry] = {}

    async def generate(self, caption: str) -> QAEntry:
        """Questions for one caption; raises ``JudgeError`` (cause ``unparsable``, ``timeout``, …)."""
        caption = caption.strip()
        if caption in self._memo:
            return self._memo[caption]
        text = await self.client.complete(
            question_generation_prompt(caption), validate=parse_generated, max_tokens=self.max_tokens
        )
        entry = parse_generated(text)
        self._memo[caption] = entry
        return entry

    async def generate_many(self, captions: list[str]) -> list[QAEntry | BaseException]:
        """Questions for many captions at once (bounded by the client's concurrency)."""
        return await asyncio.gather(*(self.generate(c) for c in captions), return_exceptions=True)
