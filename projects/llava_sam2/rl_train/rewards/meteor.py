"""METEOR as a reward: nltk's implementation (Banerjee & Lavie 2005) on our tokenisation.

``nltk.translate.meteor_score`` aligns exact words, Porter stems and WordNet synonyms and returns
``Fmean · (1 − Pen)`` with ``Fmean = P·R / (α·P + (1 − α)·R)`` and
``Pen = γ · (chunks / matches)^β`` (defaults α = 0.9, β = 3, γ = 0.5), taking the best reference.

Tokenisation (nltk METEOR needs pre-tokenised input): lower-case, then nltk's ``RegexpTokenizer``
with ``\\w+(?:'\\w+)?`` — runs of letters/digits with an optional apostrophe suffix ("man's");
punctuation is dropped (as pycocoevalcap's PTB step drops it) and hyphenated words split.

This is *not* the METEOR 1.5 number that papers report (nltk runs ~1.7x higher; ranks agree):
use :mod:`.meteor_jar` for evaluation.

WordNet must be provisioned offline (``make setup`` runs ``tools/setup/provision_wordnet.py``);
:func:`ensure_wordnet` raises :class:`WordNetMissingError` naming that fix.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from nltk.corpus.reader.wordnet import WordNetCorpusReader
from nltk.tokenize import RegexpTokenizer
from nltk.translate.meteor_score import meteor_score

from .base import RewardInputs, RewardResult, check_weight, register_reward

_TOKENIZER = RegexpTokenizer(r"\w+(?:'\w+)?")
_WORDNET_LOCK = threading.Lock()
_WORDNET_READY = False
_WORDNET: WordNetCorpusReader | None = None  # the English reader METEOR scores with, once loaded


class EnglishWordNet(WordNetCorpusReader):
    """nltk's WordNet reader without the offset map it builds for the multilingual (OMW) tables.

    METEOR looks up English synsets only, which never read that map; nltk builds it on every load (mapping WordNet
    3.0 onto itself), which is more than half of the load's CPU time, paid again by every training process.
    """

    def map_wn(self, version: str = "wordnet") -> None:
        return None


class WordNetMissingError(LookupError):
    """nltk cannot find or load WordNet; the message says how to provision it."""


def ensure_wordnet() -> None:
    """Find and load nltk's WordNet once (thread-safe); raise :class:`WordNetMissingError` if absent.

    Loading eagerly in one thread also avoids nltk's lazy-loader race when several threads score
    at once.
    """
    global _WORDNET_READY, _WORDNET
    if _WORDNET_READY:
        return
    with _WORDNET_LOCK:
        if _WORDNET_READY:
            return
        import warnings

        import nltk

        fix = (
            "Fix: run `make setup` (it runs `python tools/setup/provision_wordnet.py --target $NLTK_DATA`), "
            "or run that tool with --target <dir> and `export NLTK_DATA=<dir>`."
        )
        try:
            root = nltk.data.find("corpora/wordnet")
        except LookupError:
            raise WordNetMissingError(
                f"nltk WordNet (corpora/wordnet) not found; NLTK_DATA={os.environ.get('NLTK_DATA')!r}, "
                f"searched {list(nltk.data.path)}. {fix}"
            ) from None
        try:
            with warnings.catch_warnings():  # "multilingual functions are not available": no OMW reader, by design
                warnings.simplefilter("ignore", UserWarning)
                _WORDNET = EnglishWordNet(root, None)
        except (OSError, LookupError, ValueError) as error:
            raise WordNetMissingError(f"nltk found WordNet but cannot load it ({error}). {fix}") from None
        _WORDNET_READY = True


def tokenize_for_meteor(text: str) -> list[str]:
    """Lower-cased word tokens, punctuation dropped (see module doc)."""
    return _TOKENIZER.tokenize(text.lower())


def meteor_nltk(
    prediction: str,
    references: str | Sequence[str],
    alpha: float = 0.9,
    beta: float = 3.0,
    gamma: float = 0.5,
) -> float:
    """nltk METEOR of one prediction against one or more references (best reference wins)."""
    ensure_wordnet()
    refs = [references] if isinstance(references, str) else list(references)
    if not refs:
        raise ValueError("meteor_nltk needs at least one reference caption, got none")
    return float(
        meteor_score(
            [tokenize_for_meteor(r) for r in refs],
            tokenize_for_meteor(prediction),
            alpha=alpha,
            beta=beta,
            gamma=gamma,
            wordnet=_WORDNET,
        )
    )


@register_reward("meteor")
class MeteorReward:
    """Loop-2 reward: nltk METEOR(pred_caption, gt_caption) per rollout.

    A rollout with no predicted caption (``None``) or no reference text gets ``None``, counted as
    ``no_prediction`` / ``no_reference``.
    """

    def __init__(
        self,
        name: str = "meteor",
        weight: float = 0.25,
        alpha: float = 0.9,
        beta: float = 3.0,
        gamma: float = 0.5,
    ) -> None:
        self.name = name
        self.weight = check_weight(name, weight)
        self.alpha, self.beta, self.gamma = alpha, beta, gamma
        ensure_wordnet()  # fail at build time, not in the first training step

    def __call__(self, inputs: RewardInputs) -> RewardResult:
        preds = inputs.require("pred_captions", self.name)
        gts = inputs.require("gt_captions", self.name)
        values: list[float | None] = []
        failures: dict[str, int] = {}
        for pred, gt in zip(preds, gts):
            refs = [gt] if isinstance(gt, str) else [r for r in (gt or []) if r]
            if pred is None:
                cause = "no_prediction"
            elif not refs or not any(r.strip() for r in refs):
                cause = "no_reference"
            else:
                values.append(meteor_nltk(pred, refs, self.alpha, self.beta, self.gamma))
                continue
            values.append(None)
            failures[cause] = failures.get(cause, 0) + 1
        return RewardResult(values=values, failures=failures)

    def __repr__(self) -> str:
        return f"MeteorReward(name={self.name!r}, weight={self.weight})"
