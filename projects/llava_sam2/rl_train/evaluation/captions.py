"""Caption cleaning before METEOR, and the two METEOR numbers (never mixed).

Cleaning (``caption_cleaning``), applied to the raw greedy answer (``skip_special_tokens=False``):

* ``'sa2va'`` — Sa2VA's RefCOCOg region-caption eval (``region_cap_refcocog_eval.py``, reference/sa2va.md
  §7.2), in its order: remove ``<s>``, newlines, ``region1`` / ``Region1``, "The region marked by",
  "The region marked as", "The region marked", every occurrence of the substring ``is`` (also inside
  words: "this" → "th"), ``shows`` and ``:``; squeeze runs of three / two spaces; keep the text after the
  last "ASSISTANT: "; drop every ``<…>`` tag and ``[SEG]``; collapse whitespace; strip ``'`` and spaces.
  Use it for numbers comparable to Sa2VA's table.
* ``'tags'`` — only the ``<…>`` tags (stop tokens such as ``<|im_end|>``) and ``[SEG]`` removed,
  whitespace collapsed: the caption as the RL reward sees it.

METEOR:

* nltk (``rewards.meteor.meteor_nltk``): per caption against all references (best reference wins),
  tokenised by ``rewards.meteor.tokenize_for_meteor`` (lower-case, ``\\w+(?:'\\w+)?`` words,
  punctuation dropped). An empty caption scores 0. Reported as ``METEOR_nltk`` (mean over samples).
* METEOR 1.5 (``rewards.meteor_jar.corpus_meteor15``: PTB tokenisation + ``meteor-1.5.jar -l en -norm``,
  what pycocoevalcap's ``COCOEvalCap`` reports): one corpus score ``METEOR15_corpus`` and a per-caption
  segment score; the segment scores give ``METEOR15_mean``. nltk runs ~1.7-1.9x higher than the jar
  (reference/anchors.md §6.1), so the two are reported in separate columns.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..model.text.constants import SEG_TOKEN
from ..rewards.meteor import meteor_nltk

_TAG = re.compile(r"<.*?>")

# Substrings region_cap_refcocog_eval.py removes, in its order (before the ASSISTANT split).
_SA2VA_REMOVED = ("<s>", "\n", "region1", "Region1", "The region marked by", "The region marked as",
                  "The region marked", "is", "shows", ":")


def clean_sa2va(text: str) -> str:
    """Sa2VA's region-caption cleaning (module doc, ``'sa2va'``)."""
    for removed in _SA2VA_REMOVED:
        text = text.replace(removed, "")
    text = text.replace("   ", " ").replace("  ", " ")
    text = text.split("ASSISTANT: ")[-1]
    text = _TAG.sub("", text).replace(SEG_TOKEN, "")
    return " ".join(text.split()).strip("'").strip()


def clean_tags(text: str) -> str:
    """Tags and ``[SEG]`` removed, whitespace collapsed (module doc, ``'tags'``)."""
    return " ".join(_TAG.sub(" ", text).replace(SEG_TOKEN, " ").split())


CAPTION_CLEANERS: dict[str, Callable[[str], str]] = {"sa2va": clean_sa2va, "tags": clean_tags}


def get_cleaner(name: str) -> Callable[[str], str]:
    if name not in CAPTION_CLEANERS:
        raise ValueError(f"caption_cleaning={name!r}: expected one of {sorted(CAPTION_CLEANERS)}")
    return CAPTION_CLEANERS[name]


def meteor_per_caption(caption: str, references: Sequence[str], sample_id: str) -> float:
    """nltk METEOR of one cleaned caption (0 when empty) against its references."""
    if not references:
        raise ValueError(f"sample {sample_id!r}: no reference caption to score against; caption tasks need "
                         "samples with captions (or expressions)")
    if not caption.strip():
        return 0.0
    return meteor_nltk(caption, list(references))


def meteor15_scores(captions: Sequence[str], references: Sequence[Sequence[str]]) -> tuple[float, list[float]]:
    """(corpus METEOR 1.5, per-caption segment scores) through the persistent jar process.

    Empty captions are sent as one space-free token-less line; the jar scores them 0.
    """
    from ..rewards.meteor_jar import corpus_meteor15

    return corpus_meteor15(list(captions), [list(r) for r in references])
