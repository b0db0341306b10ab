"""DLC-Bench scoring: answer parsing, the recognition gate, per-caption and benchmark scores.

Rules as in DLC-Bench's ``eval_model_outputs.py`` (NVlabs/describe-anything):

* Answer parsing (:func:`parse_answer`), first rule that applies, case-insensitive:
  the answer equals a choice, ``"x. <choice>"`` or the bare letter; exactly one choice occurs in
  it; it starts with ``"x."``; several choices occur: the one starting last (then the longest);
  the answer occurs inside choices: the longest such choice; a lone letter (alone or before a
  newline). Otherwise it is unparsed and scores 0. These rules are for free-form answers (the
  ``per_question`` protocol). A bare letter past the last choice (``"C"`` on a two-choice question)
  is unparsed at once, as in the ``batched`` protocol: upstream's first rule indexes the choices with
  it and raises IndexError, so it never reaches the substring rules (``"c"`` inside ``"mentioned"``).
* Letter answers (:func:`parse_letter`, the ``batched`` protocol, whose prompt asks for one letter
  per question) are parsed strictly: a letter (``"b"``, ``"B."``, ``"B)"``), the exact text of a
  choice, or ``"x. <choice>"`` whose text is that letter's choice. Anything else, including a letter
  past the last choice (``"C"`` for a two-choice question), is unparsed: never matched by substring.
* Recognition gate: the recognition question ("Is it likely that the object … is a <class> …")
  is asked first; if answered "No", every positive and negative score s becomes min(0, s).
* Per caption: ``score = (Σ pos + Σ neg) / (n_pos + n_neg)``, ``score_pos = mean(pos)``,
  ``score_neg = mean(neg)`` (None without negatives).
* Benchmark: ``Pos = mean_k score_pos``, ``Neg = mean_k score_neg`` over keys with negatives,
  ``Avg = (Pos + Neg) / 2``.

Where upstream crashes we return "unparsed" instead: an empty answer, a bare letter beyond the last
choice, a ``"x."`` prefix or a lone letter before a newline beyond the last choice that no earlier rule
matched (upstream raises IndexError), and an unparsed recognition answer (upstream raises ValueError) —
the last gives ``recognition=None``, which callers count as a failure.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .prompts import RECOGNITION_CHOICES, RECOGNITION_PLURAL, RECOGNITION_SINGULAR
from .questions import QAEntry, Question

_LABELS = "abcde"
_LETTER = re.compile(r"([a-z])\s*[.)]?")  # "b", "b.", "b)" (lower-cased, stripped)


def parse_answer(answer: str, choices: Sequence[str]) -> int | None:
    """Index of the chosen choice in a judge answer, or None when unparsed (rules in module doc)."""
    pred = answer.strip().lower()
    if not pred:
        return None
    n = len(choices)
    if len(pred) == 1 and pred in _LABELS and _LABELS.index(pred) >= n:
        return None  # a bare letter past the last choice: upstream's IndexError, never a substring match
    substr = []  # (index, position in answer, choice length)
    for index, choice in enumerate(choices):
        choice = choice.strip().lower()
        if choice == pred or pred == f"{_LABELS[index]}. {choice}" or pred == _LABELS[index]:
            return index
        if choice in pred:
            substr.append((index, pred.index(choice), len(choice)))
    if len(substr) == 1:
        return substr[0][0]
    if len(pred) > 1 and pred[0] in _LABELS and pred[1] == ".":
        index = _LABELS.index(pred[0])
        return index if index < n else None
    if substr:
        last = max(position for _, position, _ in substr)
        # max() keeps the first of equals, as upstream does.
        return max((s for s in substr if s[1] == last), key=lambda s: s[2])[0]
    inside = [(index, len(c.strip())) for index, c in enumerate(choices) if pred in c.strip().lower()]
    if inside:
        return max(inside, key=lambda s: s[1])[0]
    if pred[0] in _LABELS and (len(pred) == 1 or pred[1] == "\n"):
        index = _LABELS.index(pred[0])
        return index if index < n else None
    return None


def parse_letter(answer: str, choices: Sequence[str]) -> int | None:
    """Index of the chosen choice in a letter answer (batched protocol), or None when unparsed.

    Accepts a letter (``"b"``, ``"B."``, ``"B)"``), a choice's exact text, or ``"x. <choice>"``
    with the x-th choice's text, case-insensitive; a letter past the last choice is unparsed.
    """
    pred = answer.strip().lower()
    match = _LETTER.fullmatch(pred)
    if match:
        index = ord(match.group(1)) - ord("a")
        return index if index < len(choices) else None
    for index, choice in enumerate(choices):
        choice = choice.strip().lower()
        if pred == choice or (index < len(_LABELS) and pred == f"{_LABELS[index]}. {choice}"):
            return index
    return None


PARSERS = {"free_form": parse_answer, "letter": parse_letter}


@functools.lru_cache(maxsize=1)
def _inflect_engine():
    import inflect

    return inflect.engine()


def warm_up_inflect() -> None:
    """Import inflect now (its import takes several seconds)."""
    _inflect_engine()


def is_plural(class_name: str) -> bool:
    """DLC-Bench's plurality test: inflect's ``singular_noun`` (``"bus"`` forced singular)."""
    if class_name == "bus":
        return False
    return _inflect_engine().singular_noun(class_name) is not False


@functools.lru_cache(maxsize=65536)  # inflect costs ~0.5 ms a call; class names repeat
def recognition_question(class_name: str) -> Question:
    """DLC-Bench's recognition question for a class name (asked before the others)."""
    if is_plural(class_name):
        text = RECOGNITION_PLURAL.format(class_name=class_name)
    else:
        text = RECOGNITION_SINGULAR.format(article_class_name=_inflect_engine().a(class_name))
    return Question(question=text, choices=RECOGNITION_CHOICES, type="recognition")


def questions_with_recognition(entry: QAEntry) -> tuple[Question, ...]:
    """The question list DLC-Bench asks: recognition first, then qa.json's questions."""
    return (recognition_question(entry.class_name), *entry.questions)


@dataclass(frozen=True)
class CaptionScore:
    """DLC-Bench scores of one predicted caption.

    Attributes:
        score: (Σ pos + Σ neg) / (n_pos + n_neg); None when the recognition answer was unparsed.
        score_pos: mean positive score.
        score_neg: mean negative score, None without negative questions.
        recognition: True ("Yes"), False ("No"), None (unparsed).
        n_unparsed: answers that matched no choice (scored 0 as upstream).
        answer_indices: chosen choice index per asked question (recognition first), None if unparsed.
    """

    score: float | None
    score_pos: float | None
    score_neg: float | None
    recognition: bool | None
    n_unparsed: int
    answer_indices: tuple[int | None, ...]


def score_answers(questions: Sequence[Question], answers: Sequence[str], parser: str = "free_form") -> CaptionScore:
    """Score the judge's answers to ``questions`` (recognition first) as DLC-Bench does.

    ``parser`` is ``"free_form"`` (DLC-Bench's rules, :func:`parse_answer`) or ``"letter"`` (strict
    letters, :func:`parse_letter`, for the batched protocol).
    """
    if parser not in PARSERS:
        raise ValueError(f"parser must be one of {tuple(PARSERS)}, got {parser!r}")
    parse = PARSERS[parser]
    if len(questions) != len(answers):
        raise ValueError(f"{len(answers)} answers for {len(questions)} questions")
    if not questions or questions[0].type != "recognition":
        raise ValueError("the first question must be the recognition question (questions_with_recognition)")
    indices = tuple(parse(a, [c for c, _ in q.choices]) for q, a in zip(questions, answers))
    values = [q.choices[i][1] if i is not None else 0 for q, i in zip(questions, indices)]
    recognition = {"correct": True, "incorrect": False}.get(values[0])
    n_unparsed = sum(i is None for i in indices)
    if recognition is None:
        return CaptionScore(None, None, None, None, n_unparsed, indices)
    pos, neg = [], []
    for question, value in zip(questions[1:], values[1:]):
        value = value if recognition else min(0.0, value)
        (pos if question.type == "positive" else neg).append(float(value))
    if not pos:
        raise ValueError("DLC-Bench scoring needs at least one positive question")
    return CaptionScore(
        score=(sum(pos) + sum(neg)) / (len(pos) + len(neg)),
        score_pos=sum(pos) / len(pos),
        score_neg=sum(neg) / len(neg) if neg else None,
        recognition=recognition,
        n_unparsed=n_unparsed,
        answer_indices=indices,
    )


def summarize(scores: Mapping[str, CaptionScore]) -> dict[str, float]:
    """Benchmark summary ``{"pos", "neg", "avg", "n"}`` (DLC-Bench: Avg = (Pos + Neg) / 2)."""
    valid = [s for s in scores.values() if s.score is not None]
    if not valid:
        raise ValueError("no scored captions to summarise")
    negs = [s.score_neg for s in valid if s.score_neg is not None]
    pos = sum(s.score_pos for s in valid) / len(valid)
    neg = sum(negs) / len(negs) if negs else float("nan")
    return {"pos": pos, "neg": neg, "avg": (pos + neg) / 2, "n": float(len(valid))}
