"""encode_fn: video_lisa_encode_fn layout (reference/sa2va.md §5.1) on hand-derived token layouts."""
import pytest
from transformers import PreTrainedTokenizerFast

from projects.llava_sam2.rl_train.model.text.constants import IGNORE_INDEX, IMG_CONTEXT_TOKEN
from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

CTX = IMG_CONTEXT_TOKEN
X = IGNORE_INDEX


@pytest.fixture(scope="module")
def tok():
    return load_tiny_tokenizer()


@pytest.fixture(scope="module")
def proc(tok):
    return Sa2VAProcessor(tok, template="qwen_chat", image_size=28, patch_size=14, max_dynamic_patch=1,
                          sam_image_size=32)  # g = 1: one <IMG_CONTEXT> per tile keeps ids short


def _two_turns(proc):
    return {"conversation": [
        {"input": proc.expand_image("<image>\nWhere is it?", 1), "output": "A red circle."},
        {"input": "Where is it?", "output": "Sure, [SEG]."},
    ]}


def test_two_turn_layout_by_tokens(proc, tok):
    out = proc.encode_fn(_two_turns(proc), max_length=1000)
    ids, labels = out["input_ids"], out["labels"]
    # Hand-derived (qwen_chat: INSTRUCTION '<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n',
    # SUFFIX '<|im_end|>' supervised, SEP '\n' unsupervised, no BOS for a Qwen tokenizer, no EOS
    # because SUFFIX_AS_EOS). Byte-level tokens: 'Ċ' = '\n', 'Ġ' = leading space.
    turn1_in = ["<|im_start|>", "user", "Ċ", "<img>", CTX, "</img>", "Ċ", "Where", "Ġis", "Ġit", "?",
                "<|im_end|>", "Ċ", "<|im_start|>", "assistant", "Ċ"]
    turn1_out = ["A", "Ġred", "Ġcircle", ".", "<|im_end|>"]
    turn2_in = ["<|im_start|>", "user", "Ċ", "Where", "Ġis", "Ġit", "?", "<|im_end|>", "Ċ",
                "<|im_start|>", "assistant", "Ċ"]
    turn2_out = ["Sure", ",", "Ġ", "[SEG]", ".", "<|im_end|>"]
    sep = ["Ċ"]
    expected_tokens = turn1_in + turn1_out + sep + turn2_in + turn2_out + sep
    assert tok.convert_ids_to_tokens(ids) == expected_tokens
    supervised = [l != X for l in labels]
    expected_supervised = ([False] * len(turn1_in) + [True] * len(turn1_out) + [False]
                           + [False] * len(turn2_in) + [True] * len(turn2_out) + [False])
    assert supervised == expected_supervised
    assert [l for l in labels if l != X] == [i for i, s in zip(ids, supervised) if s]
    assert labels[-1] == X and ids[-1] == tok.convert_tokens_to_ids("Ċ")


def test_matches_segment_wise_encoding(proc, tok):
    # the same layout, derived from the template strings instead of token names
    example = _two_turns(proc)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    t = proc.template
    parts = [
        (enc(t.INSTRUCTION.format(input=example["conversation"][0]["input"], round=1)), False),
        (enc("A red circle." + t.SUFFIX), True), (enc(t.SEP), False),
        (enc(t.INSTRUCTION.format(input="Where is it?", round=2)), False),
        (enc("Sure, [SEG]." + t.SUFFIX), True), (enc(t.SEP), False),
    ]
    ids = [i for p, _ in parts for i in p]
    labels = [i if sup else X for p, sup in parts for i in p]
    assert proc.encode_fn(example, 1000) == {"input_ids": ids, "labels": labels}
    assert example["conversation"][1]["input"] == "Where is it?"  # caller's example untouched


def test_right_truncation(proc, tok):
    full = proc.encode_fn(_two_turns(proc), 1000)
    cut = proc.encode_fn(_two_turns(proc), 20)
    assert cut["input_ids"] == full["input_ids"][:20] and cut["labels"] == full["labels"][:20]


def test_truncation_through_image_tokens_raises(proc):
    with pytest.raises(ValueError, match="cuts image/region tokens"):
        proc.encode_fn(_two_turns(proc), 4)  # '<|im_start|>', 'user', 'Ċ', '<img>' | CTX cut


def test_bos_only_before_the_first_turn(tok):
    # A non-Qwen fast tokenizer with a BOS (like InternLM2's '<s>'): xtuner adds it once, because
    # SUFFIX_AS_EOS=True clears "BOS pending" after each turn.
    with_bos = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer,
                                       bos_token="<|endoftext|>", eos_token="<|im_end|>")
    proc = Sa2VAProcessor(with_bos, template="internlm2_chat", image_size=28, max_dynamic_patch=1)
    out = proc.encode_fn(_two_turns(proc), 1000)
    bos = with_bos.bos_token_id
    assert out["input_ids"][0] == bos and out["labels"][0] == X
    assert out["input_ids"].count(bos) == 1


def test_phi3_suffix_is_supervised_text(tok):
    proc = Sa2VAProcessor(tok, template="phi3_chat", image_size=28, max_dynamic_patch=1)
    out = proc.encode_fn({"conversation": [{"input": "hi", "output": "It is [SEG]."}]}, 1000)
    supervised = [i for i, l in zip(out["input_ids"], out["labels"]) if l != X]
    assert tok.decode(supervised) == "It is [SEG].<|end|>"  # plain-text tag for a Qwen vocab


@pytest.mark.parametrize("example, match", [
    ({"conversation": []}, "non-empty list"),
    ({"conversation": [{"input": "<image>\nhi", "output": "x"}]}, "still contains '<image>'"),
    ({"conversation": [{"input": "hi"}], "sample_id": "d/k#3"}, r"'d/k#3'.*'input' and 'output'"),
])
def test_bad_examples(proc, example, match):
    with pytest.raises(ValueError, match=match):
        proc.encode_fn(example, 100)
