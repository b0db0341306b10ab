"""METEOR 1.5 (pycocoevalcap's jar) through one persistent Java process.

Slow only once (~8-10 s JVM start + paraphrase table); it runs in CI like every other test.
"""
import threading

import pytest

from projects.llava_sam2.rl_train.rewards.meteor_jar import Meteor15, corpus_meteor15, shared_meteor15

# docs/stack.md §9: pycocoevalcap 1.2 jar per-pair scores of these pairs
PAIRS = [
    ("a man rides a red bike on the street", ["a man is riding a red bicycle down the street"], 0.3810),
    ("two dogs play in the snow", ["two dogs are playing in the snow", "a pair of dogs play in snow"], 0.8803),
    ("a cat sitting on a sofa", ["a plate of food with broccoli and rice"], 0.0260),
]


@pytest.mark.timeout(180)
def test_meteor15_persistent_process_scores_and_closes():
    meteor = shared_meteor15()
    pid = meteor._proc.pid
    corpus, segments = meteor.score([p for p, _, _ in PAIRS], [r for _, r, _ in PAIRS])
    assert segments == pytest.approx([s for _, _, s in PAIRS], abs=1e-4)
    assert 0.0 < corpus < 1.0
    # a second call and calls from threads reuse the same process
    again = meteor.score(["identical words here"], [["identical words here"]])
    assert again == (pytest.approx(1.0), [pytest.approx(1.0)])
    results = []
    threads = [threading.Thread(target=lambda: results.append(meteor.score([PAIRS[0][0]], [PAIRS[0][1]])[1][0]))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == pytest.approx([PAIRS[0][2]] * 4, abs=1e-4)
    assert meteor._proc.pid == pid and meteor.is_running
    # separator and newline in the text cannot break the line protocol
    odd = meteor.score(["a red ||| bike\non the street"], [["a red bike on the street"]])[1][0]
    assert odd == pytest.approx(1.0, abs=1e-6)
    # COCOEvalCap-style: PTB tokenisation (drops punctuation, lower-cases) then the same process
    tok_corpus, tok_segments = corpus_meteor15(["A man rides a red bike, on the street."], [PAIRS[0][1][0]])
    assert tok_segments[0] == pytest.approx(PAIRS[0][2], abs=1e-4)
    assert shared_meteor15() is meteor
    with pytest.raises(ValueError, match="reference lists"):
        meteor.score(["a"], [])


def test_meteor15_close_is_final():
    meteor = Meteor15.__new__(Meteor15)  # no JVM: exercise the closed-process path cheaply
    import subprocess
    import tempfile
    import weakref

    from projects.llava_sam2.rl_train.rewards import meteor_jar

    meteor._lock = threading.Lock()
    meteor._stderr = tempfile.TemporaryFile()
    meteor._proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    meteor._finalizer = weakref.finalize(meteor, meteor_jar._shutdown, meteor._proc, meteor._stderr)
    meteor.close()
    assert not meteor.is_running
    with pytest.raises(RuntimeError, match="closed"):
        meteor.score(["a"], [["a"]])
