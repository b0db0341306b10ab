"""Official METEOR 1.5 (the jar bundled with pycocoevalcap) through one persistent Java process.

This is the number Sa2VA's region-caption evaluation reports (pycocoevalcap ``COCOEvalCap``:
PTB tokenisation, then ``meteor-1.5.jar -l en -norm``). Starting the JVM and loading the paraphrase
table takes ~10 s, so :class:`Meteor15` starts the jar once and talks to it over its ``-stdio``
protocol:

* ``SCORE ||| ref_1 ||| … ||| ref_k ||| hypothesis``  → one line of sufficient statistics;
* ``EVAL ||| stats_1 ||| … ||| stats_n``               → n per-segment scores, then the corpus score.

Calls are serialised by a lock (thread-safe); the process is closed by :meth:`Meteor15.close`,
on garbage collection, or at interpreter exit.
"""
from __future__ import annotations

import atexit
import shutil
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path


def default_jar_path() -> Path:
    """``meteor-1.5.jar`` inside the installed pycocoevalcap package."""
    import pycocoevalcap.meteor.meteor as meteor_module

    return Path(meteor_module.__file__).parent / "meteor-1.5.jar"


def _clean(text: str) -> str:
    """One protocol field: no field separator, no newline, single spaces."""
    return " ".join(text.replace("|||", " ").split())


class Meteor15:
    """A persistent ``java -jar meteor-1.5.jar - - -stdio -l en -norm`` process.

    Args:
        jar: path of ``meteor-1.5.jar`` (default: pycocoevalcap's, next to its ``data/`` folder).
        java: the java executable.
        max_heap: JVM ``-Xmx`` (pycocoevalcap uses 2G).
    """

    def __init__(self, jar: str | Path | None = None, java: str = "java", max_heap: str = "2G") -> None:
        self.jar = Path(jar) if jar is not None else default_jar_path()
        if not self.jar.is_file():
            raise FileNotFoundError(f"METEOR 1.5 jar not found at {self.jar}; install pycocoevalcap==1.2")
        if shutil.which(java) is None:
            raise FileNotFoundError(f"java executable {java!r} not found; install a JRE (openjdk 17 works)")
        self._lock = threading.Lock()
        self._stderr = tempfile.TemporaryFile()
        # UTF-8 so non-ASCII captions reach the jar intact whatever the locale.
        cmd = [java, "-Dfile.encoding=UTF-8", f"-Xmx{max_heap}", "-jar", str(self.jar),
               "-", "-", "-stdio", "-l", "en", "-norm"]
        self._proc = subprocess.Popen(
            cmd, cwd=self.jar.parent, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr
        )
        self._finalizer = weakref.finalize(self, _shutdown, self._proc, self._stderr)
        atexit.register(self._finalizer)

    def _exchange(self, line: str) -> str:
        """Send one request line, read one reply line; raise with the jar's stderr if it died."""
        try:
            self._proc.stdin.write((line + "\n").encode("utf-8"))
            self._proc.stdin.flush()
            reply = self._proc.stdout.readline()
        except (BrokenPipeError, ValueError, OSError):
            reply = b""
        if not reply:
            self._stderr.seek(0)
            tail = self._stderr.read().decode("utf-8", "replace")[-1000:]
            raise RuntimeError(f"METEOR 1.5 process (pid {self._proc.pid}) exited; stderr: {tail}")
        return reply.decode("utf-8").strip()

    def _exchange_read(self) -> str:
        """Read one more reply line (multi-line answers)."""
        reply = self._proc.stdout.readline()
        if not reply:
            raise RuntimeError(f"METEOR 1.5 process (pid {self._proc.pid}) closed its output")
        return reply.decode("utf-8").strip()

    def score(
        self, predictions: Sequence[str], references: Sequence[Sequence[str]]
    ) -> tuple[float, list[float]]:
        """Corpus METEOR 1.5 and per-segment scores of N predictions against their references.

        Args:
            predictions: N hypothesis strings (already tokenised as the caller wants).
            references: N lists of reference strings (at least one each).
        """
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions but {len(references)} reference lists")
        if not predictions:
            raise ValueError("Meteor15.score needs at least one prediction")
        with self._lock:
            if self._proc.poll() is not None:
                raise RuntimeError("METEOR 1.5 process is closed; create a new Meteor15")
            lines = []
            for i, (pred, refs) in enumerate(zip(predictions, references)):
                refs = [refs] if isinstance(refs, str) else list(refs)
                if not refs:
                    raise ValueError(f"segment {i}: no reference caption")
                lines.append(" ||| ".join(["SCORE", *(_clean(r) for r in refs), _clean(pred)]))
            try:
                stats = [self._exchange(line) for line in lines]
                # EVAL answers n per-segment scores, then the corpus score: n + 1 lines.
                replies = [self._exchange("EVAL ||| " + " ||| ".join(stats))]
                replies += [self._exchange_read() for _ in range(len(stats))]
                scores = [float(r) for r in replies]
            except (RuntimeError, ValueError):
                self._finalizer()  # the stream is out of step now; never reuse it
                raise
        *segments, corpus = scores
        return corpus, segments

    def close(self) -> None:
        """Stop the Java process (idempotent)."""
        with self._lock:
            self._finalizer()

    @property
    def is_running(self) -> bool:
        return self._proc.poll() is None


def _shutdown(proc: subprocess.Popen, stderr_file) -> None:
    if proc.poll() is None:
        try:
            proc.stdin.close()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
    stderr_file.close()


def ptb_tokenize(texts: Sequence[str]) -> list[str]:
    """pycocoevalcap's PTB tokenisation (lower-case, punctuation removed), as COCOEvalCap applies.

    It starts its own short-lived Java process (Stanford CoreNLP tokenizer, ~0.5 s) per call, so
    tokenise a whole evaluation split at once.
    """
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    captions = {i: [{"caption": text}] for i, text in enumerate(texts)}
    tokenized = PTBTokenizer().tokenize(captions)
    return [tokenized[i][0] for i in range(len(texts))]


_SHARED: Meteor15 | None = None
_SHARED_LOCK = threading.Lock()


def shared_meteor15() -> Meteor15:
    """A process-wide :class:`Meteor15`, started on first use."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None or not _SHARED.is_running:
            _SHARED = Meteor15()
        return _SHARED


def corpus_meteor15(
    predictions: Sequence[str], references: Sequence[str | Sequence[str]], tokenize: bool = True
) -> tuple[float, list[float]]:
    """COCOEvalCap-style METEOR 1.5: PTB-tokenise predictions and references, then score.

    Returns (corpus score, per-segment scores), the numbers pycocoevalcap reports as ``METEOR``.
    """
    refs = [[r] if isinstance(r, str) else list(r) for r in references]
    preds = list(predictions)
    if tokenize:
        flat = ptb_tokenize(preds + [r for group in refs for r in group])
        preds, rest = flat[: len(preds)], iter(flat[len(preds):])
        refs = [[next(rest) for _ in group] for group in refs]
    return shared_meteor15().score(preds, refs)
