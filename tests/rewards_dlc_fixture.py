"""A small DLC-Bench fixture in the real layout (qa.json + class_names.json), scripted judge answers
and the hand-computed scores; shared by the scoring and judge tests."""

ASK = "Which of the following is applicable to the description?"

# The fixture, in DLC-Bench's layout (qa.json positives first, then negatives; class_names.json).
QA = {
    "101": [
        {"question": ASK, "type": "positive", "choices": [
            ["The fur or the dog is not mentioned.", 0],
            ["The color of the fur is not mentioned, but the fur of the dog is mentioned.", 0.5],
            ["The color of the fur is mentioned in the description but is not brown.", -1],
            ["The color of the fur is mentioned in the description and is brown.", 1]]},
        {"question": ASK, "type": "positive", "choices": [
            ["The pose of the dog is mentioned in the description but is not sitting.", -1],
            ["The dog is not mentioned.", 0],
            ["The pose of the dog is mentioned in the description and is sitting.", 1],
            ["The pose of the dog is not mentioned, but the dog is mentioned.", 0]]},
        {"question": ASK, "type": "negative", "subtype": "salient negative", "choices": [
            ["The grass is not mentioned in the description.", 1],
            ["The grass is mentioned in the description.", -1]]},
        {"question": ASK, "type": "negative", "subtype": "negative part", "choices": [
            ["The collar of the dog is not mentioned in the description.", 1],
            ["The collar of the dog is mentioned in the description.", -1],
            ["The dog is not mentioned in the description.", 0]]},
    ],
    "102": [
        {"question": ASK, "type": "positive", "choices": [
            ["The material of the cups is mentioned in the description and is glass.", 1],
            ["The material of the cups is not mentioned, but the cups are mentioned.", 0.5],
            ["The cups are not mentioned.", 0],
            ["The material of the cups is mentioned in the description but is not glass.", -1]]},
        {"question": ASK, "type": "negative", "subtype": "salient negative", "choices": [
            ["The table is not mentioned in the description.", 1],
            ["The table is mentioned in the description.", -1]]},
    ],
    "103": [
        {"question": ASK, "type": "positive", "choices": [
            ["The color of the bus is mentioned in the description and is yellow.", 1],
            ["The color of the bus is not mentioned, but the bus is mentioned.", 0.5],
            ["The color of the bus is mentioned in the description but is not yellow.", -1],
            ["The bus is not mentioned.", 0]]},
        {"question": ASK, "type": "positive", "choices": [
            ["The windows of the bus are mentioned and are tinted.", 0.5],
            ["The windows or the bus are not mentioned.", 0],
            ["The windows of the bus are mentioned but are not tinted.", -1],
            ["The windows of the bus are tinted and are large.", 1]]},
    ],
}
CLASS_NAMES = {"101": "dog", "102": "cups", "103": "bus"}
# Judge answers per key, recognition first, and the hand-computed result.
ANSWERS = {
    "101": ["A", "D. The color of the fur is mentioned in the description and is brown.", "d",
            "The grass is not mentioned in the description.", "maybe"],
    "102": ["No", "A", "A"],
    "103": ["A. Yes", "C", "a"],
}
# 101: recognised; pos 1 (D) and 0 (d -> "not mentioned, but the dog is" = 0); neg 1 and unparsed 0
#      -> score (1 + 0 + 1 + 0) / 4 = 0.5, pos 0.5, neg 0.5
# 102: "No" -> gate: pos min(0, 1) = 0, neg min(0, 1) = 0 -> score 0, pos 0, neg 0
# 103: recognised; pos -1 (C) and 0.5 (a) -> score -0.25, pos -0.25, neg None
EXPECTED = {"101": (0.5, 0.5, 0.5, True, 1), "102": (0.0, 0.0, 0.0, False, 0), "103": (-0.25, -0.25, None, True, 0)}

# The batched protocol asks for letters and parses them strictly. 101's "C" answers the two-choice grass
# question: unparsed (0), where the free-form rules would match the longest choice containing "c" (the
# +1 "not mentioned" one) and inflate the reward.
ANSWERS_BATCHED = {"101": ["A", "D", "d", "C", "maybe"], "102": ["B", "A", "A"], "103": ["A.", "C", "a)"]}
# 101: recognised; pos 1 and 0; neg unparsed 0 and unparsed 0 -> score (1 + 0 + 0 + 0) / 4 = 0.25, pos 0.5, neg 0
EXPECTED_BATCHED = {**EXPECTED, "101": (0.25, 0.5, 0.0, True, 2)}

PREDICTIONS = {key: f"Prediction for region {key}." for key in QA}
_KEY_OF_CAPTION = {caption: key for key, caption in PREDICTIONS.items()}


def scripted_answer(prompt: str) -> str:
    """The judge's scripted reply to a DLC-Bench per-question or batched prompt about PREDICTIONS."""
    import json

    from projects.llava_sam2.rl_train.rewards.judge import prompts

    caption = prompt.split("The description is:\n", 1)[1].split("\n\n", 1)[0]
    key = _KEY_OF_CAPTION[caption]
    if prompts.is_batched_eval_prompt(prompt):
        return json.dumps({"answers": ANSWERS_BATCHED[key]})
    if "Is it likely that the object" in prompt:
        return ANSWERS[key][0]
    first_choice = prompt.split("\nA. ", 1)[1].split("\n", 1)[0]
    index = [q["choices"][0][0] for q in QA[key]].index(first_choice)
    return ANSWERS[key][1 + index]
