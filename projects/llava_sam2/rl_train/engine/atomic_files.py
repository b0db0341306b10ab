"""Crash-safe files: durable writes, atomic commits, and finding the newest complete checkpoint of a work dir.

A checkpoint is *complete* once it sits under its final name (``iter_<step>.pth``, a file, or a DeepSpeed
directory): ``AtomicCheckpointHook`` writes it under ``<final>.partial``, writes its side files, flushes everything
to disk and only then renames it (the commit), so a kill at any moment leaves either the previous checkpoints
untouched or the new one complete. ``last_checkpoint`` (MMEngine's pointer, read by ``resume=True``) is replaced
atomically after the commit, so it always names a complete checkpoint.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import zipfile
from collections.abc import Callable

PARTIAL_SUFFIX = ".partial"
POINTER_FILE = "last_checkpoint"  # MMEngine's name (mmengine.runner.checkpoint.find_latest_checkpoint)


def fsync_path(path: str) -> None:
    """Flush a file, or every file of a directory tree and the directories themselves, to disk."""
    if os.path.isdir(path):
        for root, _, files in os.walk(path):
            for name in files:
                fsync_path(os.path.join(root, name))
            _fsync_fd(root, os.O_RDONLY)
    elif os.path.exists(path):
        _fsync_fd(path, os.O_RDONLY)


def _fsync_fd(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Make a rename or unlink inside directory ``path`` durable."""
    _fsync_fd(path, os.O_RDONLY)


def remove_path(path: str) -> None:
    """Remove a file or a directory tree if it exists."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def commit(partial: str, final: str) -> None:
    """Flush ``partial`` and rename it to ``final`` (atomic on one filesystem); durable on return."""
    fsync_path(partial)
    if os.path.isdir(final) and not os.path.islink(final):
        shutil.rmtree(final)  # os.replace cannot replace a non-empty directory
    os.replace(partial, final)
    fsync_dir(os.path.dirname(os.path.abspath(final)))


def atomic_write_text(path: str, text: str) -> None:
    """Replace ``path`` by a file holding ``text``: a reader sees the old or the new content, never a part."""
    tmp = path + PARTIAL_SUFFIX
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


# ---- finding a complete checkpoint ------------------------------------------------------------------------------


def is_loadable(path: str) -> bool:
    """True if ``path`` (a ``torch.save`` file or a DeepSpeed checkpoint directory) and the side files next to it
    read back without error: every file is a zip archive whose members pass their CRC check."""
    files = ([path] if os.path.isfile(path) else
             sorted(glob.glob(os.path.join(path, "**", "*.pt"), recursive=True)) if os.path.isdir(path) else [])
    files += sorted(glob.glob(glob.escape(path.rstrip(os.sep)) + ".*.pth"))
    if not files:
        return False
    for file in files:
        try:
            with zipfile.ZipFile(file) as archive:
                if archive.testzip() is not None:
                    return False
        except (OSError, zipfile.BadZipFile, EOFError):
            return False
    return True


def checkpoint_steps(directory: str, filename_tmpl: str = "iter_{}.pth") -> dict[int, str]:
    """``{step: path}`` of the checkpoints named ``filename_tmpl`` in ``directory`` (temporary names excluded)."""
    prefix, _, suffix = filename_tmpl.partition("{}")
    pattern = re.compile(re.escape(prefix) + r"(\d+)" + re.escape(suffix) + r"$")
    found = {}
    for name in os.listdir(directory) if os.path.isdir(directory) else ():
        match = pattern.match(name)
        if match:
            found[int(match.group(1))] = os.path.join(directory, name)
    return found


def read_pointer(work_dir: str) -> str | None:
    """The checkpoint named by ``<work_dir>/last_checkpoint``, or None."""
    pointer = os.path.join(work_dir, POINTER_FILE)
    if not os.path.isfile(pointer):
        return None
    with open(pointer) as f:
        return f.read().strip() or None


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _pointed_checkpoint(work_dir: str, filename_tmpl: str, log: Callable[[str], None]) -> str | None:
    """The checkpoint ``last_checkpoint`` names, resolved inside ``work_dir``: the pointer holds an absolute path,
    so in a copied work dir it names the original's file; the copy's file of that name is used instead. A pointer to
    another directory is followed only when ``work_dir`` holds no checkpoint (``AtomicCheckpointHook(out_dir=...)``)."""
    pointed = read_pointer(work_dir)
    if pointed is None or _same_path(os.path.dirname(pointed), work_dir):
        return pointed
    local = os.path.join(work_dir, os.path.basename(pointed))
    if os.path.exists(local):
        log(f"last_checkpoint names {pointed}, outside {work_dir} (a copied or moved work dir); using {local}.")
        return local
    if checkpoint_steps(work_dir, filename_tmpl):
        log(f"last_checkpoint names {pointed}, outside {work_dir}, which has checkpoints of its own; ignoring it.")
        return None
    log(f"last_checkpoint names {pointed}, outside {work_dir} (checkpoints saved to another out_dir); following it.")
    return pointed


def newest_complete_checkpoint(work_dir: str, filename_tmpl: str = "iter_{}.pth",
                               log: Callable[[str], None] = print) -> str | None:
    """The checkpoint to resume from: the one ``last_checkpoint`` names if it loads (resolved inside ``work_dir``,
    ``_pointed_checkpoint``), else the highest-step checkpoint of ``work_dir`` that loads; None if there is none.
    Every checkpoint passed over for not reading back is named through ``log``.

    The pointer comes first because it belongs to the current trajectory: a run resumed from an older checkpoint
    in the same work dir may leave higher-numbered checkpoints of the abandoned one behind.
    """
    pointed = _pointed_checkpoint(work_dir, filename_tmpl, log)
    if pointed is not None and os.path.exists(pointed):
        if is_loadable(pointed):
            return pointed
        log(f"skipping {pointed} (named by last_checkpoint): it or a side file next to it does not read back "
            "(truncated or corrupt).")
    for _, path in sorted(checkpoint_steps(work_dir, filename_tmpl).items(), reverse=True):
        if pointed is not None and _same_path(path, pointed):
            continue
        if is_loadable(path):
            return path
        log(f"skipping {path}: it or a side file next to it does not read back (truncated or corrupt).")
    return None
