"""The tiny Qwen2-style tokenizer used by tests and the demo, and checks for any Sa2VA tokenizer.

The tiny tokenizer is a byte-level BPE trained with the ``tokenizers`` library on a built-in corpus
(chat templates, Sa2VA prompts, shapes-world words, common caption words). It is laid out like the
released Qwen-based Sa2VA tokenizers so xtuner and the processor treat it the same way:

    [BPE vocab: 256 byte symbols + merges] [<|endoftext|> <|im_start|> <|im_end|>]
    [<img> </img> <IMG_CONTEXT> <quad> </quad> <ref> </ref> <box> </box>] [[SEG] <p> </p> <vp> </vp>]

class Qwen2TokenizerFast, no BOS, EOS ``<|im_end|>``, pad ``<|endoftext|>``. The shipped copy lives in
``assets/tiny_tokenizer``; ``tools/setup/build_tiny_tokenizer.py`` (``sa2va-rl setup tiny-tokenizer``) regenerates
it bit-identically.
"""
from __future__ import annotations

import itertools
import os
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast, Qwen2TokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX
from xtuner.utils import PROMPT_TEMPLATE

from .constants import (
    INTERNVL_SPECIAL_TOKENS,
    QWEN_CHAT_SPECIAL_TOKENS,
    QWEN_ENDOFTEXT_TOKEN,
    QWEN_IM_END_TOKEN,
    SA2VA_SPECIAL_TOKENS,
)
from .prompts import (
    ANSWER_LIST,
    DETAILED_QUESTIONS,
    REGION_CAPTION_EVAL_PROMPT,
    RES_EVAL_PROMPT,
    SEG_QUESTIONS,
    SHORT_ANSWER_SUFFIX,
    detailed_question,
    region_string,
)

TINY_TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "assets" / "tiny_tokenizer"
# Upper bound on byte alphabet + merges (the corpus yields ~1.1k); the 17 special tokens come after.
TINY_BPE_VOCAB_SIZE = 1280
TINY_MODEL_MAX_LENGTH = 32768

COLOURS = ("red", "green", "blue", "yellow", "orange", "purple", "pink", "brown", "black", "white",
           "gray", "grey", "cyan", "magenta")
SHAPES = ("circle", "square", "triangle", "star", "ellipse", "cross", "ring", "hexagon", "rectangle",
          "diamond", "pentagon", "oval", "heart", "line", "dot", "blob")
SIZES = ("tiny", "small", "medium", "large", "big", "huge", "little")
POSITIONS = ("left", "right", "top", "bottom", "middle", "center", "centre", "upper", "lower",
             "corner", "edge", "side", "upper left", "upper right", "lower left", "lower right",
             "top left", "top right", "bottom left", "bottom right")
RELATIONS = ("above", "below", "next to", "beside", "near", "between", "inside", "outside",
             "left of", "right of", "on top of", "under", "behind", "in front of", "close to",
             "far from", "touching", "overlapping", "surrounding", "largest", "smallest", "leftmost",
             "rightmost", "topmost", "bottommost", "closest", "other", "same", "different")
COMMON_WORDS = (
    "a an the this that these those it its is are was were be been has have with without and or "
    "but of in on at to from by for as into over one two three four five six seven eight nine ten "
    "first second third last only both each every some many few more most no not there here "
    "which what where who how image picture photo region area object shape part mask segment "
    "segmentation description describe show shows shown color colour colored filled outlined "
    "solid striped bright dark light pale round pointed thin thick wide narrow long short tall "
    "background foreground scene person man woman people dog cat car tree table chair sky grass "
    "water road building window door wall floor white plain empty visible lying sitting standing "
    "near the edge of the image yes sure please thanks answer question result "
    "can could would should will may might do does did make made see seen look looks looking "
    "appears appear located placed positioned sits lies stands contains containing covered "
    "partly fully almost mostly slightly very quite just also then than other another "
    "group pair set row column grid pattern stripe border outline frame center centre "
    "circular square shaped triangular rectangular oval star shaped cross shaped hexagonal "
    "ringed curved straight diagonal vertical horizontal upward downward toward away "
    "man woman boy girl child baby player rider horse bike bicycle motorcycle bus truck train "
    "boat plane bird sheep cow elephant bear zebra giraffe umbrella bag bottle cup bowl plate "
    "banana apple orange pizza cake sandwich couch bed tv laptop phone book clock vase shirt "
    "jacket hat hair face hand head arm leg shoe glasses holding wearing riding walking "
    "playing eating looking talking smiling young old front back half whole piece corner"
).split()


def tiny_corpus() -> list[str]:
    """Deterministic training text: templates, Sa2VA prompts and shapes-world sentences."""
    lines: list[str] = []
    for name in ("qwen_chat", "phi3_chat", "internlm2_chat"):
        template = PROMPT_TEMPLATE[name]
        lines += [template.SYSTEM.format(system="You are a helpful assistant."),
                  template.INSTRUCTION.format(input="Describe the image.", round=1) + "It shows a shape."
                  + template.SUFFIX + template.SEP]
    lines += [REGION_CAPTION_EVAL_PROMPT, SHORT_ANSWER_SUFFIX, region_string([0, 0, 0])]
    lines += [detailed_question(q, 1 + i % 3) for i, q in enumerate(DETAILED_QUESTIONS)]
    lines += list(ANSWER_LIST)
    noun_phrases = [f"{size} {colour} {shape}" for size, colour, shape in
                    itertools.product(SIZES, COLOURS, SHAPES)]
    for index, phrase in enumerate(noun_phrases):
        position = POSITIONS[index % len(POSITIONS)]
        relation = RELATIONS[index % len(RELATIONS)]
        other = noun_phrases[(index * 7 + 3) % len(noun_phrases)]
        lines.append(f"a {phrase} in the {position} of the image.")
        lines.append(f"The {phrase} is {relation} the {other}.")
        lines.append(SEG_QUESTIONS[index % len(SEG_QUESTIONS)].format(class_name=phrase))
        lines.append(RES_EVAL_PROMPT.format(sent=f"the {phrase} {relation} the {other}"))
    lines.append(" ".join(COMMON_WORDS))
    lines += [" ".join(COMMON_WORDS[i:i + 12]) + "." for i in range(0, len(COMMON_WORDS), 12)]
    lines.append("0 1 2 3 4 5 6 7 8 9 10 11 12 100 2024 , . ; : ! ? ' \" ( ) [ ] - _ / \\ \n\n")
    return lines


def _added(token: str) -> AddedToken:
    return AddedToken(token, lstrip=False, rstrip=False, normalized=False, single_word=False, special=True)


def build_tiny_tokenizer() -> Qwen2TokenizerFast:
    """Train the tiny byte-level BPE and wrap it as a Qwen2TokenizerFast with the Sa2VA tokens."""
    backend = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    # Same normaliser / pre-tokeniser / decoder layout as the Qwen2 tokenizer.json.
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    backend.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                                  use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=TINY_BPE_VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    backend.train_from_iterator(tiny_corpus(), trainer=trainer)
    backend.add_special_tokens([_added(t) for t in QWEN_CHAT_SPECIAL_TOKENS + INTERNVL_SPECIAL_TOKENS])
    tokenizer = Qwen2TokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token=QWEN_IM_END_TOKEN,
        pad_token=QWEN_ENDOFTEXT_TOKEN,
        unk_token=None,
        errors="replace",
        clean_up_tokenization_spaces=False,
        model_max_length=TINY_MODEL_MAX_LENGTH,
        split_special_tokens=False,
    )
    tokenizer.add_tokens(list(SA2VA_SPECIAL_TOKENS), special_tokens=True)  # as Sa2VA's SFT does
    check_sa2va_tokenizer(tokenizer, where="tiny tokenizer build")
    return tokenizer


def save_tiny_tokenizer(out_dir: str | os.PathLike = TINY_TOKENIZER_DIR) -> list[Path]:
    """Build and save the tiny tokenizer; returns the written files, sorted."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = build_tiny_tokenizer().save_pretrained(str(out), legacy_format=False)
    return sorted(Path(p) for p in written if Path(p).exists())


def load_tiny_tokenizer(path: str | os.PathLike = TINY_TOKENIZER_DIR) -> PreTrainedTokenizerFast:
    """Load the shipped tiny tokenizer (Qwen2TokenizerFast) and check its Sa2VA tokens."""
    directory = Path(path)
    if not (directory / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"tiny tokenizer: {directory / 'tokenizer.json'} is missing; regenerate it with "
            "`python tools/setup/build_tiny_tokenizer.py`"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    check_sa2va_tokenizer(tokenizer, where=str(directory))
    return tokenizer


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """The tokenizer saved in the local directory ``path`` (a Sa2VA checkpoint or a tokenizer directory).

    Nothing is downloaded: a path that is not a local directory (a Hub id such as ``ByteDance/Sa2VA-4B``, a typo)
    raises ``FileNotFoundError`` naming it, instead of reaching for the network in the middle of a run."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer directory {os.fspath(path)!r} does not exist (relative paths start at "
                                f"{os.getcwd()}); give a local checkpoint or tokenizer directory. Nothing is "
                                "downloaded at run time: fetch a Hub model first (e.g. `huggingface-cli download`).")
    return AutoTokenizer.from_pretrained(os.fspath(path), trust_remote_code=True, local_files_only=True)


def sa2va_tokenizer(path: str | os.PathLike | None, preset: str | None) -> PreTrainedTokenizerBase:
    """The tokenizer of a model source: the local directory ``path`` (a tokenizer or the checkpoint's), else the
    shipped tiny tokenizer for ``preset='tiny'``; other presets need a path."""
    if path is not None:
        return load_tokenizer(path)
    if preset == "tiny":
        return load_tiny_tokenizer()
    raise ValueError(f"preset={preset!r} needs a tokenizer whose special tokens match the model: give the directory "
                     "of one (model.tokenizer in a config, --tokenizer on the command line); only preset='tiny' has a "
                     "built-in one.")


def check_sa2va_tokenizer(tokenizer: PreTrainedTokenizerFast, where: str = "tokenizer") -> None:
    """Raise if a Sa2VA token is missing, split into pieces or not special, or EOS is unset."""
    vocab = tokenizer.get_vocab()
    special = {str(t) for t in tokenizer.added_tokens_decoder.values() if t.special}
    for token in INTERNVL_SPECIAL_TOKENS[:3] + SA2VA_SPECIAL_TOKENS:
        if token not in vocab:
            raise ValueError(
                f"{where}: token {token!r} is missing. A Sa2VA tokenizer needs the InternVL image "
                f"tokens and {list(SA2VA_SPECIAL_TOKENS)}; add them with "
                "tokenizer.add_tokens([...], special_tokens=True)"
            )
        if token not in special:
            raise ValueError(f"{where}: token {token!r} exists but is not special; re-add it with "
                             "special_tokens=True so it is never split or merged")
        ids = tokenizer.encode(token, add_special_tokens=False)
        if ids != [vocab[token]]:
            raise ValueError(f"{where}: {token!r} encodes to {ids}, expected the single id {vocab[token]}")
    if tokenizer.eos_token_id is None:
        raise ValueError(f"{where}: eos_token is unset; set it to the template's end token "
                         f"(e.g. {QWEN_IM_END_TOKEN!r} for qwen_chat)")
