"""Provision WordNet 3.0 for nltk offline, as ``<target>/corpora/wordnet``.

nltk's METEOR needs WordNet. This project never downloads data at run time, so ``make setup``
runs this command once (through ``tools/setup/provision_wordnet.py``)::

    sa2va-rl setup wordnet --target "$NLTK_DATA"

Sources, tried in order:

1. an nltk ``wordnet`` corpus already on this machine (a folder or ``wordnet.zip`` on
   ``nltk.data.path``);
2. Debian's ``wordnet-base`` + ``wordnet-sense-index`` files in ``/usr/share/wordnet``. When they
   are missing and we run as root with apt-get, the tool installs the two packages
   (``--no-apt`` turns that off).

nltk >= 3.10 refuses symlinks and hard links out of its data root, so files are copied.
Debian ships no ``lexnames`` file, so it is written from the table in the ``lexnames(5WN)``
manual page. ``index.sense`` comes only from ``wordnet-sense-index``; nltk opens it at start-up.
The tool is idempotent: a complete, loadable target is left alone.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PROG = "sa2va-rl setup wordnet"
DEBIAN_DIR = Path("/usr/share/wordnet")
DEBIAN_PACKAGES = ("wordnet-base", "wordnet-sense-index")
POS_SUFFIXES = ("noun", "verb", "adj", "adv")
# What nltk's WordNetCorpusReader opens: data/index/exception files per POS, the sense index and
# the lexicographer-file names (cntlist.rev is optional: only Lemma.count() reads it).
REQUIRED_FILES = (
    tuple(f"data.{p}" for p in POS_SUFFIXES)
    + tuple(f"index.{p}" for p in POS_SUFFIXES)
    + tuple(f"{p}.exc" for p in POS_SUFFIXES)
    + ("index.sense",)
)
OPTIONAL_FILES = ("cntlist.rev", "LICENSE")

# lexnames(5WN): file number, lexicographer file name, syntactic category
# (1 noun, 2 verb, 3 adjective, 4 adverb). WordNet 3.0 has 45 files.
LEXNAMES = (
    "adj.all 3", "adj.pert 3", "adv.all 4", "noun.Tops 1", "noun.act 1", "noun.animal 1",
    "noun.artifact 1", "noun.attribute 1", "noun.body 1", "noun.cognition 1",
    "noun.communication 1", "noun.event 1", "noun.feeling 1", "noun.food 1", "noun.group 1",
    "noun.location 1", "noun.motive 1", "noun.object 1", "noun.person 1", "noun.phenomenon 1",
    "noun.plant 1", "noun.possession 1", "noun.process 1", "noun.quantity 1",
    "noun.relation 1", "noun.shape 1", "noun.state 1", "noun.substance 1", "noun.time 1",
    "verb.body 2", "verb.change 2", "verb.cognition 2", "verb.communication 2",
    "verb.competition 2", "verb.consumption 2", "verb.contact 2", "verb.creation 2",
    "verb.emotion 2", "verb.motion 2", "verb.perception 2", "verb.possession 2",
    "verb.social 2", "verb.stative 2", "verb.weather 2", "adj.ppl 3",
)


def lexnames_text() -> str:
    """The ``lexnames`` file: one ``NN<TAB>name<TAB>category`` row per lexicographer file."""
    rows = []
    for number, entry in enumerate(LEXNAMES):
        name, category = entry.split()
        rows.append(f"{number:02d}\t{name}\t{category}")
    return "\n".join(rows) + "\n"


def verify(nltk_root: Path) -> str:
    """Load ``nltk_root/corpora/wordnet`` through nltk in a fresh interpreter; returns its version.

    A fresh process because nltk's reader resolves "wordnet" through ``nltk.data.path`` (its
    version map), which is fixed at import time from ``NLTK_DATA``.
    """
    corpus_dir = nltk_root / "corpora" / "wordnet"
    missing = [name for name in REQUIRED_FILES + ("lexnames",) if not (corpus_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{corpus_dir} lacks {missing}")
    probe = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "from nltk.corpus import wordnet as wn\n"
        "dog = wn.synsets('dog')\n"
        "assert dog and dog[0].lexname() == 'noun.animal', dog[:2]\n"
        "assert wn.morphy('running', 'v') == 'run'\n"
        "print(wn.get_version())\n"
    )
    env = dict(os.environ, NLTK_DATA=str(nltk_root))
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"nltk cannot use WordNet at {corpus_dir}: {result.stderr.strip()[-800:]}")
    return result.stdout.strip()


def find_local_nltk_wordnet(exclude: Path) -> Path | None:
    """An nltk ``corpora/wordnet`` folder or ``corpora/wordnet.zip`` on nltk's search path."""
    import nltk

    for root in map(Path, nltk.data.path):
        for candidate in (root / "corpora" / "wordnet", root / "corpora" / "wordnet.zip"):
            if candidate.exists() and candidate.resolve() != exclude.resolve():
                return candidate
    return None


def copy_from_nltk(source: Path, staging: Path) -> None:
    """Copy (or unzip) an nltk WordNet corpus into ``staging`` as real files."""
    if source.suffix == ".zip":
        with zipfile.ZipFile(source) as archive:
            for member in archive.namelist():
                name = Path(member).name
                if name and not member.endswith("/"):
                    (staging / name).write_bytes(archive.read(member))
    else:
        for path in source.iterdir():
            if path.is_file():
                shutil.copyfile(path, staging / path.name)


def ensure_debian_files(use_apt: bool) -> None:
    """Install wordnet-base + wordnet-sense-index with apt-get when their files are missing."""
    if all((DEBIAN_DIR / name).is_file() for name in REQUIRED_FILES):
        return
    command = f"apt-get update && apt-get install -y {' '.join(DEBIAN_PACKAGES)}"
    can_apt = use_apt and shutil.which("apt-get") and os.geteuid() == 0
    if not can_apt:
        raise SystemExit(
            f"setup wordnet: {DEBIAN_DIR} lacks WordNet files and no nltk wordnet corpus was "
            f"found. Fix: run `{command}` as root (or put nltk's wordnet corpus on NLTK_DATA), "
            "then re-run this tool."
        )
    print(f"setup wordnet: installing {' '.join(DEBIAN_PACKAGES)} with apt-get", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", *DEBIAN_PACKAGES], check=True, env=env)
    missing = [name for name in REQUIRED_FILES if not (DEBIAN_DIR / name).is_file()]
    if missing:
        raise SystemExit(f"setup wordnet: after `{command}`, {DEBIAN_DIR} still lacks {missing}")


def copy_from_debian(staging: Path) -> None:
    """Copy Debian's WordNet files (real copies, no links) and write ``lexnames``."""
    for name in REQUIRED_FILES + OPTIONAL_FILES:
        if (DEBIAN_DIR / name).is_file():
            shutil.copyfile(DEBIAN_DIR / name, staging / name)
    (staging / "lexnames").write_text(lexnames_text())


def provision(target: Path, use_apt: bool = True) -> Path:
    """Make ``target/corpora/wordnet`` a complete nltk WordNet corpus; returns its path."""
    dest = target / "corpora" / "wordnet"
    if dest.is_dir():
        try:
            version = verify(target)
            (dest / "lexnames").touch()  # newer than this tool, so make stops re-running it
            print(f"setup wordnet: {dest} already holds WordNet {version}")
            return dest
        except Exception as error:  # incomplete or broken: rebuild below
            print(f"setup wordnet: rebuilding {dest} ({error})")
            shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Build in a sibling folder and rename, so an interrupted run never leaves a half corpus
    # under the name that make checks.
    staging = Path(tempfile.mkdtemp(prefix=".wordnet-", dir=dest.parent))
    try:
        source = find_local_nltk_wordnet(exclude=dest)
        if source is not None:
            print(f"setup wordnet: copying nltk corpus {source}")
            copy_from_nltk(source, staging)
        if source is None or not (staging / "lexnames").is_file():
            ensure_debian_files(use_apt)
            print(f"setup wordnet: copying Debian WordNet files from {DEBIAN_DIR}")
            copy_from_debian(staging)
        os.replace(staging, dest)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    try:
        version = verify(target)
    except Exception:
        shutil.rmtree(dest)
        raise
    print(f"setup wordnet: WordNet {version} ready at {dest}")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, type=Path,
                        help="nltk data root (the Makefile passes $(NLTK_DATA))")
    parser.add_argument("--no-apt", action="store_true",
                        help="never run apt-get; fail with the command to run instead")
    args = parser.parse_args(argv)
    provision(args.target.expanduser().absolute(), use_apt=not args.no_apt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
