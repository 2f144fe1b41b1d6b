"""Durable file operations under ``phalanx.checkpoint``: atomic writes and new directories.

A rename or a new directory entry survives a power cut only once its directory is on disk,
so every one is followed by an fsync of the directory that holds it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import IO

TMP_SUFFIX = ".tmp"


def fsync_dir(directory: Path) -> None:
    """Make the entries of ``directory`` (renames, new files and subdirectories) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(directory: Path) -> None:
    """``mkdir -p directory``, fsyncing the parent of each directory it creates."""
    missing: list[Path] = []
    level = directory
    while not level.is_dir():
        missing.append(level)
        level = level.parent
    for new in reversed(missing):
        # One made by a racing process is fsynced too: that process may die before its fsync.
        with contextlib.suppress(FileExistsError):
            os.mkdir(new)
        fsync_dir(new.parent)


def write_tmp(path: Path, write: Callable[[IO[bytes]], object]) -> Path:
    """Write a temporary file next to ``path`` with ``write`` and fsync it; returns its path.

    On an exception the temporary file is removed; a kill leaves it for pruning.
    """
    # Not tempfile.mkstemp: its 0600 mode would stick to the checkpoint; this honours umask.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if not isinstance(exc, OSError) and _disk_full(exc):
            # torch.save wraps the write's ENOSPC in a RuntimeError of its own: say it as
            # what it is, with the file it was for.
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from exc
        raise
    return tmp


def _disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` was caused, somewhere down its chain, by a full disk (ENOSPC)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def rename_into_place(tmp: Path, path: Path) -> None:
    """Rename the fsynced ``tmp`` to ``path`` and make the rename durable."""
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_atomic(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Replace ``path`` with what ``write`` writes: readers see the old file or the new one."""
    rename_into_place(write_tmp(path, write), path)
