"""Opening files in run directories without following a symbolic link anywhere in their path.

phalanx resolves a run directory's path once, when it makes it (``phalanx.resources.rundir``), so a
path under it that still holds a symlink has been tampered with: whoever planted one there
(``report.json`` -> ``/etc/shadow``, ``attempt_1`` -> some other directory) would have the
launcher, often root, write where they chose. Every component is therefore opened relative
to its parent's descriptor with ``O_NOFOLLOW`` (``openat`` style), and a symlink met on the
way is an ``OSError`` saying so. Standard library only: the worker-side code uses it too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class SymlinkRefused(OSError):
    """A symbolic link (or a non-directory) where phalanx expected one of its directories."""


def _refused(path: str, part: str) -> SymlinkRefused:
    return SymlinkRefused(
        errno.ELOOP,
        f"{part!r} in its path is a symbolic link or not a directory "
        "(phalanx follows none in a run directory)",
        path,
    )


def open_dir(path: str | os.PathLike[str], *, create: bool = False, mode: int = 0o700) -> int:
    """A descriptor of directory ``path`` (absolute, or relative to the working directory),
    reached without following a symlink in any component; ``create`` makes the missing ones
    with ``mode``. The caller closes it."""
    text = os.path.abspath(os.fspath(path))
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in filter(None, text.split("/")):
            try:
                inner = _enter(fd, part, create, mode)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refused(text, part) from None
                raise
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _enter(fd: int, part: str, create: bool, mode: int) -> int:
    try:
        return os.open(part, _DIRECTORY, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):  # made by another thread meanwhile: fine
        os.mkdir(part, mode, dir_fd=fd)
    return os.open(part, _DIRECTORY, dir_fd=fd)


def make_dirs(path: str | os.PathLike[str], mode: int = 0o700) -> None:
    """``mkdir -p`` that refuses, rather than follows, a symlink on the way."""
    os.close(open_dir(path, create=True, mode=mode))


def open_file(path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags | O_NOFOLLOW)`` with no symlink followed in the directories
    above it either. Give ``O_CREAT | O_EXCL`` for a file that must be new."""
    text = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(text)
    dir_fd = open_dir(parent)
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(text, name) from None
        raise
    finally:
        os.close(dir_fd)


def append_to(path: str | os.PathLike[str]) -> int:
    """A write descriptor at the end of ``path``, made if missing (logs)."""
    return open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def replace_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``path`` whole: ``data`` goes to a new temporary file beside it (``O_EXCL``),
    which is then renamed over it. A symlink at ``path`` is replaced, its target untouched."""
    text = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(text)
    dir_fd = open_dir(parent)
    try:
        replace_in(dir_fd, name, data)
    finally:
        os.close(dir_fd)


def replace_in(dir_fd: int, name: str, data: bytes) -> None:
    """``replace_file`` of ``name`` in the directory open as ``dir_fd`` (a writer that keeps
    its directory open saves walking the path each time: on a slow filesystem, seconds)."""
    temporary = f".{name}.{os.getpid()}.{threading.get_ident()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                 | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)  # fmt: skip
    try:
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
