"""The lock of a checkpoint directory: one writer at a time saves or prunes in it.

An ``flock`` on ``.checkpoint.lock`` in the directory. The kernel drops it when its holder
dies, however it dies, so a killed writer never leaves the directory locked. The holder
writes who it is into the file (host, pid, what it does, since when) for the error a
waiting writer raises when it gives up.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("phalanx")

LOCK_FILE = ".checkpoint.lock"
# Long enough for another writer's save of a large checkpoint to slow storage; short enough
# that a writer frozen while holding the lock (SIGSTOP, a hung mount) is reported, not waited
# for forever.
DEFAULT_LOCK_TIMEOUT = 600.0
_POLL_S = 0.05
# flock is missing on some network filesystems (Lustre mounted without -o flock).
_NO_FLOCK = {errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK}


class CheckpointLocked(RuntimeError):
    """Another writer held the checkpoint directory's lock for longer than ``lock_timeout``."""


def _holder(fd: int) -> str:
    try:
        who = json.loads(os.pread(fd, 4096, 0))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(who["since"]))
        return f"pid {who['pid']} on {who['host']} ({who['doing']} since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"  # it has the lock but has not written its name yet


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _acquire(fd: int, folder: Path, timeout: float | None) -> None:
    if _try_lock(fd):
        return
    limit = "as long as it takes" if timeout is None else f"lock_timeout={timeout:g}"
    log.warning("checkpoint directory %s is locked by %s; waiting (%s)", folder, _holder(fd), limit)
    deadline = None if timeout is None else time.monotonic() + timeout
    while not _try_lock(fd):
        if deadline is not None and time.monotonic() >= deadline:
            raise CheckpointLocked(
                f"checkpoint directory {folder} is still locked by {_holder(fd)} after "
                f"waiting {timeout:g} s ({limit}): another process is saving into it. Only "
                "one process (rank 0) should save; lock_timeout=None waits as long as it takes"
            )
        time.sleep(_POLL_S)


@contextlib.contextmanager
def locked(folder: Path, doing: str, timeout: float | None) -> Iterator[None]:
    """Hold ``folder``'s lock inside the block, waiting at most ``timeout`` s for it."""
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            _acquire(fd, folder, timeout)
        except OSError as e:
            if e.errno not in _NO_FLOCK:
                raise
            log.warning("checkpoint directory %s cannot be locked (%s): saving as its only "
                        "writer", folder, os.strerror(e.errno))  # fmt: skip
        else:
            who = {"host": socket.gethostname(), "pid": os.getpid(), "doing": doing,
                   "since": time.time()}  # fmt: skip
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(who).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the flock
