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


def newest_complete_checkpoint(work_dir: str, filename_tmpl: str = "iter_{}.pth") -> str | None:
    """The checkpoint to resume from: the one ``last_checkpoint`` names if it loads, else the highest-step
    checkpoint of ``work_dir`` that loads; None if there is none.

    The pointer comes first because it belongs to the current trajectory: a run resumed from an older checkpoint
    in the same work dir may leave higher-numbered checkpoints of the abandoned one behind.
    """
    pointed = read_pointer(work_dir)
    if pointed is not None and os.path.exists(pointed) and is_loadable(pointed):
        return pointed
    for _, path in sorted(checkpoint_steps(work_dir, filename_tmpl).items(), reverse=True):
        if is_loadable(path):
            return path
    return None
