"""Where a run's files go: a directory only its user can steer.

Default: ``$TMPDIR/phalanx-<uid>`` (``tempfile.gettempdir()``, so ``/tmp`` unless ``TMPDIR``
says otherwise), one per user, made with mode 0700. Not ``$XDG_RUNTIME_DIR``: that is a small
tmpfs that logind empties when the user's last session ends (a batch job's logs would vanish
with its ssh session) and it is unset under most schedulers and containers. Because the name
is predictable, a directory found there is checked before use -- a real directory, not a
symlink, owned by us, writable by nobody else -- and refused otherwise, as is a ``TMPDIR``
that group or others may write to without the sticky bit (they could rename ours away).

An explicit ``--log-dir`` is the user's choice: the part of its path that exists is followed
as given (a symlink there is theirs), except that a directory anyone may write to without
the sticky bit is refused; every directory phalanx makes below it (missing ``--log-dir``
components, then the run directory) is made 0700 and never a symlink followed.

Each run gets a fresh directory under that base, made 0700 and named by its path resolved
once, so nothing below it is ever reached through a symlink (``phalanx.worker.nofollow``).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from phalanx.errors import UsageError
from phalanx.worker.nofollow import open_dir

_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def default_log_base() -> Path:
    return Path(tempfile.gettempdir()) / f"phalanx-{os.geteuid()}"


def make_run_dir(log_dir: Path | None, run_id: str) -> Path:
    """A new, empty, 0700 run directory ``<base>/<run id>_<random>``; its path has no
    symlink in it. A base that fails the checks above is a ``UsageError`` (one line)."""
    base = _chosen_base(log_dir) if log_dir is not None else _private_base(default_log_base())
    try:
        base_fd = open_dir(base)
        try:
            return base / _new_dir(base_fd, run_id.replace("/", "_"))
        finally:
            os.close(base_fd)
    except OSError as exc:
        flag = "--log-dir" if log_dir is not None else "the log directory (--log-dir)"
        raise UsageError(
            f"{flag} {base}: cannot make the run directory there: {exc.strerror or exc}"
        ) from None


def _new_dir(base_fd: int, prefix: str) -> str:
    while True:  # as mkdtemp: a random name, taken only if nobody has it
        # secrets.token_hex(4) is this; importing secrets (hmac, base64) cost ~1 ms a launch
        name = f"{prefix}_{os.urandom(4).hex()}"
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=base_fd)
            return name


def _unsafe(where: str, why: str, hint: str) -> UsageError:
    return UsageError(f"{where}: {why}; {hint}")


def _private_base(base: Path) -> Path:
    """Make or check the default ``$TMPDIR/phalanx-<uid>``; return its resolved path."""
    hint = "remove it, or give --log-dir a directory of your own"
    where = f"the default log directory {base}"
    parent = Path(os.path.realpath(base.parent))
    try:
        above = os.stat(parent)
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        why = f"its parent cannot be read ({exc.strerror})"
        raise _unsafe(where, why, "set TMPDIR or --log-dir") from None
    if above.st_mode & _WRITABLE_BY_OTHERS and not above.st_mode & stat.S_ISVTX:
        os.close(parent_fd)
        raise _unsafe(
            where,
            f"{parent} may be written by group or others and has no sticky bit (mode "
            f"{stat.S_IMODE(above.st_mode):04o}), so anyone could replace it",
            "set TMPDIR or --log-dir",
        )
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(base.name, 0o700, dir_fd=parent_fd)
        found = os.stat(base.name, dir_fd=parent_fd, follow_symlinks=False)
        if stat.S_ISLNK(found.st_mode):
            raise _unsafe(where, "it is a symbolic link", hint)
        if not stat.S_ISDIR(found.st_mode):
            raise _unsafe(where, "it is not a directory", hint)
        # Checked on what was opened, not on the name: it cannot be swapped in between.
        fd = os.open(base.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=parent_fd)  # fmt: skip
        try:
            _check_ours(os.fstat(fd), where, hint)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _unsafe(where, f"it cannot be made or opened ({exc.strerror or exc})", hint) from None
    finally:
        os.close(parent_fd)
    return parent / base.name


def _check_ours(found: os.stat_result, where: str, hint: str) -> None:
    # Explicit for root too, which the kernel would let write anywhere.
    me = os.geteuid()
    if found.st_uid != me:
        raise _unsafe(where, f"it is owned by uid {found.st_uid}, not by you (uid {me})", hint)
    if found.st_mode & _WRITABLE_BY_OTHERS:
        mode = stat.S_IMODE(found.st_mode)
        raise _unsafe(where, f"it may be written by group or others (mode {mode:04o})", hint)


def _chosen_base(log_dir: Path) -> Path:
    """``--log-dir``: follow what exists, make the rest 0700 without following symlinks."""
    where = f"--log-dir {log_dir}"
    absolute = Path(os.path.abspath(log_dir))
    existing, missing = absolute, []
    while not existing.exists() and existing != existing.parent:
        missing.append(existing.name)
        existing = existing.parent
    resolved = Path(os.path.realpath(existing))
    try:
        found = os.stat(resolved)
    except OSError as exc:
        raise _unsafe(where, f"cannot be read ({exc.strerror or exc})", "check the path") from None
    if not stat.S_ISDIR(found.st_mode):
        raise _unsafe(
            where, f"cannot make the run directory there: {resolved} is not a directory",
            "give a directory",
        )  # fmt: skip
    if found.st_mode & stat.S_IWOTH and not found.st_mode & stat.S_ISVTX:
        raise _unsafe(
            where,
            f"{resolved} may be written by anyone and has no sticky bit (mode "
            f"{stat.S_IMODE(found.st_mode):04o}), so anyone could swap what phalanx writes there",
            "give a directory of your own (phalanx makes it with mode 0700)",
        )
    base = resolved.joinpath(*reversed(missing))
    try:
        os.close(open_dir(base, create=True))
    except OSError as exc:
        raise _unsafe(
            where, f"cannot make the run directory there: {exc.strerror or exc}", "check the path"
        ) from None
    return base
