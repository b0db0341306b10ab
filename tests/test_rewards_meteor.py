"""nltk METEOR reward against direct nltk calls; the missing-WordNet error; the provisioning table.

Needs WordNet at $NLTK_DATA (``make test`` provisions it). Skipped only when NLTK_DATA is unset.
"""
import gzip
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not os.environ.get("NLTK_DATA"), reason="NLTK_DATA unset: run through `make test`, which provisions WordNet"
)

PAIRS = [
    ("a man rides a red bike on the street", "a man is riding a red bicycle down the street"),
    ("two dogs play in the snow", ["two dogs are playing in the snow", "a pair of dogs play in snow"]),
    ("a cat sitting on a sofa", "a plate of food with broccoli and rice"),
    ("The woman's umbrella is RED.", "the woman holding a red umbrella, walking in the rain"),
]


def test_meteor_matches_direct_nltk_calls():
    from nltk.translate.meteor_score import meteor_score

    from projects.llava_sam2.rl_train.rewards import MeteorReward, RewardInputs, meteor_nltk, tokenize_for_meteor

    assert tokenize_for_meteor("The woman's umbrella, red-brown.") == ["the", "woman's", "umbrella", "red", "brown"]
    direct = []
    for pred, refs in PAIRS:
        refs = [refs] if isinstance(refs, str) else refs
        direct.append(meteor_score([tokenize_for_meteor(r) for r in refs], tokenize_for_meteor(pred)))
        assert meteor_nltk(pred, refs) == pytest.approx(direct[-1], abs=1e-12)
    # docs/stack.md §8: a known value of nltk's METEOR on pre-tokenised input
    assert meteor_score([["a", "man", "is", "riding", "a", "red", "bicycle"]],
                        ["a", "man", "rides", "a", "red", "bike"]) == pytest.approx(0.7014, abs=1e-4)
    assert direct[2] < 0.2 < direct[0] < direct[1]
    reward = MeteorReward()
    inputs = RewardInputs(
        sample_ids=[f"s#{i}" for i in range(6)],
        pred_captions=[p for p, _ in PAIRS] + [None, "a dog"],
        gt_captions=[g for _, g in PAIRS] + ["a dog", "  "],
    )
    result = reward(inputs)
    assert result.values[:4] == pytest.approx(direct, abs=1e-12)
    assert result.values[4:] == [None, None]
    assert result.failures == {"no_prediction": 1, "no_reference": 1}


def test_the_english_reader_skips_nltks_multilingual_map_and_finds_the_same_synsets():
    """ensure_wordnet loads WordNet without the OMW offset map (more than half of nltk's load time, read only by
    non-English lemma tables); the English synsets METEOR's synonym stage reads are nltk's own reader's. Equal METEOR
    scores to nltk's reader: the test above."""
    from nltk.corpus import wordnet

    from projects.llava_sam2.rl_train.rewards import meteor

    meteor.ensure_wordnet()
    assert isinstance(meteor._WORDNET, meteor.EnglishWordNet) and meteor._WORDNET.map30 is None
    for word in ("bike", "riding", "umbrella", "red", "sofa"):
        ours = [(s.name(), s.lemma_names()) for s in meteor._WORDNET.synsets(word)]
        assert ours and ours == [(s.name(), s.lemma_names()) for s in wordnet.synsets(word)], word


def test_missing_wordnet_names_the_fix(tmp_path, monkeypatch):
    """With no WordNet on nltk's search path, ensure_wordnet raises naming the provisioning tool."""
    import nltk

    from projects.llava_sam2.rl_train.rewards import meteor

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    monkeypatch.setattr(meteor, "_WORDNET_READY", False)
    with pytest.raises(meteor.WordNetMissingError) as info:
        meteor.ensure_wordnet()
    message = str(info.value)
    assert "tools/setup/provision_wordnet.py" in message and "make setup" in message and str(tmp_path) in message
    with pytest.raises(meteor.WordNetMissingError):
        meteor.MeteorReward()  # fails at build time, not in a training step


def test_lexnames_table_matches_man_page():
    from projects.llava_sam2.rl_train.cli.setup_wordnet import LEXNAMES, lexnames_text

    rows = lexnames_text().splitlines()
    assert len(rows) == len(LEXNAMES) == 45
    assert rows[0] == "00\tadj.all\t3" and rows[44] == "44\tadj.ppl\t3" and rows[5] == "05\tnoun.animal\t1"
    man = Path("/usr/share/man/man5/lexnames.5WN.gz")
    if man.exists():  # wordnet-base ships the page the table was written from
        text = gzip.open(man, "rt", errors="replace").read()
        for row in rows:
            number, name, _ = row.split("\t")
            assert f"{number}\t{name}" in text.replace("  \t", "\t").replace(" \t", "\t"), row
    corpus = Path(os.environ["NLTK_DATA"]) / "corpora" / "wordnet"
    assert (corpus / "lexnames").read_text() == lexnames_text() or (corpus / "lexnames").exists()
    assert not any(p.is_symlink() for p in corpus.iterdir())  # nltk rejects links out of its root
