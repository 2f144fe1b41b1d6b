"""Where a user's warm services listen: one directory per user, mode 0700, and in it, per
key, ``KEY.sock`` (the service's socket), ``KEY.lock`` (held while a launch starts one) and
``KEY.log`` (the service's stderr).

The directory is ``$XDG_RUNTIME_DIR/phalanx-service`` (the user's own tmpfs, removed at
logout) or else ``$TMPDIR/phalanx-service-UID`` (``/tmp``). Only its owner can reach a socket
inside it; it is checked at every use (ours, a directory, not a link, no access for group or
others), and a service also checks each peer's uid (``SO_PEERCRED``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
import struct
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

SOCKET = ".sock"
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class UnsafeDirectory(Exception):
    """The service directory exists but is not one only this user can use."""


def service_dir(environ: Mapping[str, str]) -> Path:
    """The directory (made if missing); ``UnsafeDirectory`` if another user could use it."""
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        path = Path(runtime) / "phalanx-service"
    else:
        base = environ.get("TMPDIR") or tempfile.gettempdir()
        path = Path(base) / f"phalanx-service-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeDirectory(f"{path} is not a directory")
    if info.st_uid != os.getuid():
        raise UnsafeDirectory(f"{path} belongs to uid {info.st_uid}, not {os.getuid()}")
    if info.st_mode & 0o077:
        raise UnsafeDirectory(f"{path} has mode {stat.S_IMODE(info.st_mode):o}, expected 700")
    return path


def socket_path(directory: Path, key: str) -> Path:
    return directory / f"{key}{SOCKET}"


def sockets(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{SOCKET}"))


def peer(sock: socket.socket) -> tuple[int, int]:
    """The (pid, uid) of the process at the other end of a Unix socket (``SO_PEERCRED``)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, _ = _PEERCRED.unpack(raw)
    return pid, uid


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (made 0600 if missing)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
