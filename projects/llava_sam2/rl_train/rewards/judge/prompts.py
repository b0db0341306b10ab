"""Judge prompt texts.

``DLC_EVAL_PROMPT`` and the recognition questions are DLC-Bench's, character for character
(NVlabs/describe-anything ``evaluation/eval_model_outputs.py``: ``prompt_eval`` and the recognition
question built in ``__main__``), so per-question judging reproduces the benchmark. The batched
answer prompt and the question-generation prompt are this project's own.
"""
from __future__ import annotations

import json

# DLC-Bench's judge prompt (``prompt_eval``); one user message per question.
DLC_EVAL_PROMPT = """Answer the multiple-choice question based on the text description of an object in an image. You need to follow these rules:
1. Do not output any reasoning. Do not perform correction. Please output exactly one answer from the choices for each question. Do not repeat the question.
2. There is no need for exact matching. Please choose the closest option based on the description.

The description is:
{pred_caption}

From the description above, please answer the following question with one of the choices:
{question_text_str}
"""

# DLC-Bench's recognition question, singular (with inflect's article) and plural forms.
RECOGNITION_SINGULAR = (
    "Is it likely that the object in the description is {article_class_name} or an object of a "
    "similar type? Again, It does not have to be an exact match."
)
RECOGNITION_PLURAL = (
    "Is it likely that the objects in the description are {class_name} or objects of a similar "
    "type? Again, It does not have to be an exact match."
)
RECOGNITION_CHOICES = (("Yes", "correct"), ("No", "incorrect"))

CHOICE_LETTERS = "ABCDE"

# Ours: all questions of one caption in one request, answered as JSON letters.
BATCHED_EVAL_PROMPT = """Answer each multiple-choice question based on the text description of an object in an image. You need to follow these rules:
1. Do not output any reasoning. Do not perform correction. Choose exactly one answer from the choices of each question.
2. There is no need for exact matching. Please choose the closest option based on the description.
3. Reply with JSON only, in this form: {{"answers": ["<letter>", ...]}}, one choice letter per question, in question order ({n_questions} letters).

The description is:
{pred_caption}

Questions:
{questions_block}
"""

# Ours: DLC-Bench-style questions from a reference caption, in qa.json's schema.
QUESTION_GENERATION_PROMPT = """You write a multiple-choice test that checks whether a description of one object (an image region) states the right details. Below is the reference description of the object. Build the test from it, following DLC-Bench.

Return JSON only, with exactly these keys:
{{
  "class_name": "<the object's category as a short lower-case noun phrase; plural if the description is about several objects, e.g. \\"dog\\", \\"traffic light\\", \\"cups\\">",
  "positive": [<2 to 5 positive questions>],
  "negative": [<2 to 5 negative questions>]
}}
Each question is {{"question": "Which of the following is applicable to the description?", "choices": [["<choice text>", <score>], ...]}}; negative questions also have "subtype".

Positive questions check one attribute (colour, material, shape, pattern, texture, state, pose, count) of the object or of one of its parts that the reference states. Give exactly 4 choices, in any order, with these scores:
  1   "The <attribute> of the <part> is mentioned in the description and is <value>."
  0.5 "The <attribute> of the <part> is not mentioned, but the <part> of the <object> is mentioned."  (use 0 instead when the part alone earns no credit)
  0   "The <part> or the <object> is not mentioned."
  -1  "The <attribute> of the <part> is mentioned in the description but is not <value>."
Negative questions check that a description does not invent things. Use one of two subtypes:
  "salient negative": something salient that is NOT part of the object (a nearby object or the background), 2 choices:
     1 "The <thing> is not mentioned in the description."   -1 "The <thing> is mentioned in the description."
  "negative part": a part this kind of object could have but that the reference does not have or show, 3 choices:
     1 "The <part> of the <object> is not mentioned in the description."   -1 "The <part> of the <object> is mentioned in the description."   0 "The <object> is not mentioned in the description."
Use only facts from the reference for positive questions. Scores must be numbers.

Reference description:
{caption}
"""


def format_question(question: str, choices) -> str:
    """DLC-Bench's question block: the question, then ``A. choice`` lines (stripped at the end)."""
    text = f"{question}\n"
    for letter, (choice, _score) in zip(CHOICE_LETTERS, choices):
        text += f"{letter}. {choice}\n"
    return text.strip()


def dlc_eval_prompt(pred_caption: str, question: str, choices) -> str:
    """One DLC-Bench judge prompt (per-question mode)."""
    return DLC_EVAL_PROMPT.format(pred_caption=pred_caption, question_text_str=format_question(question, choices))


def batched_eval_prompt(pred_caption: str, questions) -> str:
    """One prompt holding every question of a caption; ``questions`` are ``(question, choices)`` pairs."""
    blocks = [f"Q{i + 1}. {format_question(q, c)}" for i, (q, c) in enumerate(questions)]
    return BATCHED_EVAL_PROMPT.format(
        n_questions=len(blocks), pred_caption=pred_caption, questions_block="\n\n".join(blocks)
    )


def question_generation_prompt(caption: str) -> str:
    """The question-generation prompt for one reference caption."""
    return QUESTION_GENERATION_PROMPT.format(caption=caption.strip())


def is_batched_eval_prompt(text: str) -> bool:
    return text.startswith(BATCHED_EVAL_PROMPT.split("\n", 1)[0])


def is_dlc_eval_prompt(text: str) -> bool:
    return text.startswith(DLC_EVAL_PROMPT.split("\n", 1)[0])


def is_question_generation_prompt(text: str) -> bool:
    return text.startswith(QUESTION_GENERATION_PROMPT.split("\n", 1)[0])


def extract_json_object(text: str):
    """The JSON object in a reply (tolerating a ```json fence or text around it); raises ValueError."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise ValueError("no JSON object in the reply")
    try:
        return json.loads(text[start : end + 1])
    except json.JSONDecodeError as error:
        raise ValueError(f"invalid JSON: {error}") from None
