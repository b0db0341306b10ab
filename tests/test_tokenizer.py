"""The shipped tiny tokenizer: Qwen2TokenizerFast layout, Sa2VA tokens last, round trip, rebuild."""
import filecmp
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2TokenizerFast
from xtuner.dataset.utils import get_bos_eos_token_ids

from projects.llava_sam2.rl_train.model.text.constants import (
    INTERNVL_SPECIAL_TOKENS,
    QWEN_CHAT_SPECIAL_TOKENS,
    SA2VA_SPECIAL_TOKENS,
)
from projects.llava_sam2.rl_train.model.text.tokenizer import (
    TINY_TOKENIZER_DIR,
    check_sa2va_tokenizer,
    load_tiny_tokenizer,
    save_tiny_tokenizer,
)


@pytest.fixture(scope="module")
def tok():
    return load_tiny_tokenizer()


def test_shipped_files_and_class(tok):
    names = sorted(p.name for p in TINY_TOKENIZER_DIR.iterdir())
    assert names == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    assert type(tok) is Qwen2TokenizerFast
    assert type(AutoTokenizer.from_pretrained(str(TINY_TOKENIZER_DIR))) is Qwen2TokenizerFast
    assert 1000 <= len(tok) <= 2000


def test_special_tokens_are_last_in_upstream_order(tok):
    # [BPE vocab][<|endoftext|> <|im_start|> <|im_end|>][9 InternVL tokens][[SEG] <p> </p> <vp> </vp>]
    expected = QWEN_CHAT_SPECIAL_TOKENS + INTERNVL_SPECIAL_TOKENS + SA2VA_SPECIAL_TOKENS
    n = len(tok)
    assert tok.convert_ids_to_tokens(list(range(n - len(expected), n))) == list(expected)
    assert tok.convert_tokens_to_ids(list(SA2VA_SPECIAL_TOKENS)) == list(range(n - 5, n))
    special = {str(t) for t in tok.added_tokens_decoder.values() if t.special}
    assert set(expected) <= special


def test_qwen_conventions_for_xtuner(tok):
    assert tok.bos_token is None and tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    bos, eos = get_bos_eos_token_ids(tok)
    assert bos == [] and eos == [tok.convert_tokens_to_ids("<|im_end|>")]
    assert tok.encode("hello", add_special_tokens=True) == tok.encode("hello", add_special_tokens=False)


@pytest.mark.parametrize("text", [
    "<|im_start|>user\n<img><IMG_CONTEXT><IMG_CONTEXT></img>\nThere are 1 part regions in the "
    "picture: region1<vp><IMG_CONTEXT></vp>.\nPlease segment the red star.<|im_end|>\n",
    "Sure, the segmentation result is [SEG].<|im_end|>",
    "<p> a small blue hexagon </p> [SEG] to the left of the ring",
    "  two  spaces,\ttabs\n\nand unicode: café, 東京 ☃ 123456789",
    "<|user|>\nphi3 tags are plain text<|end|>\n<|assistant|>\n",
])
def test_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == text


def test_special_tokens_are_single_ids_and_skippable(tok):
    ids = tok.encode("<IMG_CONTEXT>" * 5 + "[SEG]", add_special_tokens=False)
    assert ids == [tok.convert_tokens_to_ids("<IMG_CONTEXT>")] * 5 + [tok.convert_tokens_to_ids("[SEG]")]
    assert tok.decode(tok.encode("It is [SEG].", add_special_tokens=False), skip_special_tokens=True) == "It is ."
    # shapes-world words are whole tokens (the corpus taught them)
    assert tok.tokenize(" hexagon") == ["Ġhexagon"] and tok.tokenize(" triangle") == ["Ġtriangle"]


def test_rebuild_is_bit_identical(tmp_path):
    written = save_tiny_tokenizer(tmp_path)
    assert sorted(p.name for p in written) == sorted(p.name for p in TINY_TOKENIZER_DIR.iterdir())
    for path in written:
        assert filecmp.cmp(path, TINY_TOKENIZER_DIR / path.name, shallow=False), path.name


# Demo phrases (shapes-world expressions and captions of 25 seeded scenes, the pretraining questions and answers, a
# chat turn) with the ids the tiny tokenizer gave them when the pretrained tiny model was built
# (transformers 4.48, tokenizers 0.21; the committed tokenizer.json of that stack serialised one offsets-only flag
# differently).
DEMO_IDS = Path(__file__).parent / "data" / "tiny_tokenizer_demo_ids.json"
PRETRAINED_DIR = TINY_TOKENIZER_DIR.parent / "tiny_shapes_pretrained"


@pytest.mark.parametrize("directory", [TINY_TOKENIZER_DIR, PRETRAINED_DIR], ids=["tiny_tokenizer", "pretrained"])
def test_demo_phrases_tokenize_as_when_the_tiny_model_was_pretrained(directory):
    recorded = json.loads(DEMO_IDS.read_text())["phrases"]
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    changed = [text for text, ids in recorded if tokenizer.encode(text, add_special_tokens=False) != ids]
    assert len(recorded) > 300 and not changed, f"{len(changed)} phrases tokenize differently, e.g. {changed[:3]}"


def test_check_rejects_tokenizer_without_sa2va_tokens():
    bare = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), eos_token="</s>")
    with pytest.raises(ValueError, match=r"'<img>' is missing.*special_tokens=True"):
        check_sa2va_tokenizer(bare, where="my_tok")


def test_load_missing_dir_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="build_tiny_tokenizer.py"):
        load_tiny_tokenizer(tmp_path)


@pytest.fixture
def hub_calls(monkeypatch):
    """Every Hub download transformers attempts; each fails at once (no network in a test)."""
    import transformers.utils.hub as hub

    calls = []

    def refuse(*args, **kwargs):
        calls.append((args, kwargs))
        raise RuntimeError("a Hub download was attempted")

    monkeypatch.setattr(hub, "hf_hub_download", refuse)
    return calls


@pytest.mark.parametrize("load", ["evaluation", "training"])
def test_a_hub_id_is_refused_by_name_without_a_download(load, hub_calls):
    """Evaluation and training read a tokenizer through one loader with one policy: local directories only."""
    from projects.llava_sam2.rl_train.engine.builders import build_tokenizer
    from projects.llava_sam2.rl_train.evaluation.loading import load_system

    with pytest.raises(FileNotFoundError, match=r"'ByteDance/Sa2VA-4B' does not exist.*Nothing is downloaded"):
        if load == "evaluation":
            load_system(preset="4b", tokenizer="ByteDance/Sa2VA-4B")
        else:
            build_tokenizer("ByteDance/Sa2VA-4B", preset="4b")
    assert hub_calls == []


def test_a_local_directory_and_the_tiny_preset_load(tmp_path):
    from projects.llava_sam2.rl_train.model.text.tokenizer import load_tokenizer, sa2va_tokenizer

    load_tiny_tokenizer().save_pretrained(str(tmp_path))
    assert load_tokenizer(tmp_path).get_vocab() == load_tiny_tokenizer().get_vocab()
    assert sa2va_tokenizer(None, "tiny").get_vocab() == load_tiny_tokenizer().get_vocab()
    with pytest.raises(ValueError, match="preset='4b' needs a tokenizer"):
        sa2va_tokenizer(None, "4b")
