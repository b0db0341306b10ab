"""DLC-Bench scoring: answer parsing rules, recognition questions, hand-computed scores on a qa.json
fixture in the real layout, exact prompt text, and strict validation of generated questions."""
import json

import pytest

from projects.llava_sam2.rl_train.rewards.judge import (
    load_qa, parse_answer, parse_letter, save_qa, score_answers, summarize)
from projects.llava_sam2.rl_train.rewards.judge.prompts import dlc_eval_prompt
from projects.llava_sam2.rl_train.rewards.judge.questions import parse_generated, validate_generated
from projects.llava_sam2.rl_train.rewards.judge.scoring import questions_with_recognition, recognition_question
from rewards_dlc_fixture import ANSWERS, ASK, CLASS_NAMES, EXPECTED, QA

@pytest.fixture
def qa_files(tmp_path):
    qa_path, names_path = tmp_path / "qa.json", tmp_path / "class_names.json"
    qa_path.write_text(json.dumps(QA))
    names_path.write_text(json.dumps(CLASS_NAMES))
    return qa_path, names_path


def test_hand_computed_scores_on_fixture(qa_files, tmp_path):
    qa = load_qa(*qa_files)
    scores = {}
    for key, entry in qa.items():
        scores[key] = score_answers(questions_with_recognition(entry), ANSWERS[key])
        score, pos, neg, recognised, unparsed = EXPECTED[key]
        assert (scores[key].score, scores[key].score_pos, scores[key].score_neg) == (score, pos, neg), key
        assert scores[key].recognition is recognised and scores[key].n_unparsed == unparsed
    summary = summarize(scores)
    # Pos = (0.5 + 0 - 0.25) / 3, Neg = (0.5 + 0) / 2 (103 has no negatives), Avg = (Pos + Neg) / 2
    assert summary["pos"] == pytest.approx(0.25 / 3)
    assert summary["neg"] == pytest.approx(0.25)
    assert summary["avg"] == pytest.approx((0.25 / 3 + 0.25) / 2)
    save_qa(qa, tmp_path / "qa2.json", tmp_path / "names2.json")  # round trip in the same layout
    assert json.loads((tmp_path / "qa2.json").read_text()) == QA
    assert load_qa(tmp_path / "qa2.json", tmp_path / "names2.json") == qa


def test_unparsed_recognition_gives_no_score(qa_files):
    entry = load_qa(*qa_files)["103"]
    result = score_answers(questions_with_recognition(entry), ["perhaps", "A", "A"])
    assert result.score is None and result.recognition is None


@pytest.mark.parametrize("answer, choices, expected", [
    ("Yes", ["Yes", "No"], 0),                                    # exact choice
    ("B. No", ["Yes", "No"], 1),                                  # "x. choice"
    ("b", ["Yes", "No"], 1),                                      # bare letter
    ("I would say no", ["Yes", "No"], 1),                         # one choice inside the answer
    ("a. something else", ["red", "blue"], 0),                    # "x." prefix
    ("the red car", ["red", "red car"], 1),                       # several at one position: longest
    ("dog or cat", ["cat", "dog"], 0),                            # several: the one starting last
    ("mentioned", ["The sky is not mentioned", "The sky is mentioned in the description"], 1),  # inside
    ("c\nbecause", ["x1", "x2", "x3"], 2),                        # lone letter before a newline
    ("e", ["No", "Ok"], None),                                     # letter beyond the choices
    ("e", ["Yes", "No"], None),                                   # bare letter past the last choice: upstream
    ("C", ["not mentioned", "mentioned"], None),                  # raises IndexError; unparsed, never a substring
    ("e. foo", ["red", "blue"], None),
    ("", ["Yes", "No"], None),
    ("maybe", ["The grass is mentioned.", "The grass is not mentioned."], None),
])
def test_parse_answer_rules(answer, choices, expected):
    assert parse_answer(answer, choices) == expected


@pytest.mark.parametrize("answer, choices, expected", [
    ("A", ["Yes", "No"], 0), ("b", ["Yes", "No"], 1), (" B. ", ["Yes", "No"], 1), ("b)", ["Yes", "No"], 1),
    ("No", ["Yes", "No"], 1),                                     # a choice's exact text
    ("B. No", ["Yes", "No"], 1),                                  # "x. choice" with x's own choice
    ("A. No", ["Yes", "No"], None),                               # letter and text disagree
    ("e", ["Yes", "No"], None),                                   # past the last choice: never a substring match
    ("C", ["The grass is not mentioned in the description.", "The grass is mentioned in the description."], None),
    ("I would say no", ["Yes", "No"], None),                      # free form is not a letter
    ("", ["Yes", "No"], None), ("AB", ["Yes", "No"], None),
])
def test_parse_letter_is_strict(answer, choices, expected):
    assert parse_letter(answer, choices) == expected


def test_letter_past_last_choice_is_unparsed_not_rewarded_in_both_protocols(qa_files):
    # Two-choice negative question: "C" is out of range. It used to match inside the longer (+1) choice under
    # the free-form rules; upstream raises IndexError on it. Both parsers leave it unparsed (0) and count it.
    entry = load_qa(*qa_files)["102"]
    questions = questions_with_recognition(entry)
    for parser in ("free_form", "letter"):
        score = score_answers(questions, ["A", "A", "C"], parser=parser)
        assert score.score_neg == 0.0 and score.n_unparsed == 1 and score.answer_indices == (0, 0, None), parser
    with pytest.raises(ValueError, match="parser must be one of"):
        score_answers(questions, ["A", "A", "A"], parser="regex")


def test_recognition_questions():
    assert recognition_question("dog").question == (
        "Is it likely that the object in the description is a dog or an object of a similar type? "
        "Again, It does not have to be an exact match.")
    assert "is an apple or an object" in recognition_question("apple").question
    assert recognition_question("cups").question == (
        "Is it likely that the objects in the description are cups or objects of a similar type? "
        "Again, It does not have to be an exact match.")
    assert "is a bus or an object" in recognition_question("bus").question  # upstream's special case
    # inflect<=7.5 treats "glass" as a plural (DLC-Bench's cached prompts say "are wine glass"); pin 7.5.0
    assert "objects in the description are wine glass" in recognition_question("wine glass").question


def test_dlc_prompt_text_is_exact():
    prompt = dlc_eval_prompt("A brown dog.", "Q?", [("Yes", "correct"), ("No", "incorrect")])
    assert prompt == (
        "Answer the multiple-choice question based on the text description of an object in an image. "
        "You need to follow these rules:\n"
        "1. Do not output any reasoning. Do not perform correction. Please output exactly one answer from the "
        "choices for each question. Do not repeat the question.\n"
        "2. There is no need for exact matching. Please choose the closest option based on the description.\n\n"
        "The description is:\nA brown dog.\n\n"
        "From the description above, please answer the following question with one of the choices:\n"
        "Q?\nA. Yes\nB. No\n")


def _generated(**overrides):
    obj = {"class_name": "dog", "positive": [dict(QA["101"][0])], "negative": [dict(q) for q in QA["101"][2:]]}
    for item in obj["positive"] + obj["negative"]:
        item.pop("type")
    obj.update(overrides)
    return obj


def test_generated_questions_strict_validation():
    entry = parse_generated("```json\n" + json.dumps(_generated()) + "\n```")
    assert entry.class_name == "dog" and [q.type for q in entry.questions] == ["positive", "negative", "negative"]
    bad_scores = _generated(positive=[{"question": ASK, "choices": [["a", 1], ["b", 1], ["c", 0], ["d", -1]]}])
    three_choices = _generated(positive=[{"question": ASK, "choices": [["a", 1], ["b", 0], ["c", -1]]}])
    no_subtype = _generated(negative=[{"question": ASK, "choices": [["a", 1], ["b", -1]]}])
    string_score = _generated(positive=[{"question": ASK, "choices": [["a", "1"], ["b", 0.5], ["c", 0], ["d", -1]]}])
    for bad, message in [
        (bad_scores, "expected 4 choices"), (three_choices, "expected 4 choices"),
        (no_subtype, "negative 'subtype'"), (string_score, "finite number"),
        (_generated(class_name=""), "class name"), (_generated(extra=1), "unexpected keys"),
        (_generated(positive=[]), "at least one positive"),
    ]:
        with pytest.raises(ValueError, match=message):
            validate_generated(bad)
    for text in ["no json here", '{"class_name": "dog", "positive": [', "[1, 2]"]:
        with pytest.raises(ValueError):
            parse_generated(text)


def test_load_qa_errors_name_the_file(tmp_path):
    qa_path, names_path = tmp_path / "qa.json", tmp_path / "class_names.json"
    qa_path.write_text(json.dumps({"7": [{"question": ASK, "type": "positive", "choices": [["a", 1]]}]}))
    names_path.write_text(json.dumps({"7": "dog"}))
    with pytest.raises(ValueError, match=r"qa.json key '7' question 0: 'choices'"):
        load_qa(qa_path, names_path)
    names_path.write_text("{}")
    with pytest.raises(ValueError, match="no class name for 1 keys"):
        load_qa(qa_path, names_path)
