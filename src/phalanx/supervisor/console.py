"""The launcher's console (its stdout and stderr), shared by every stream of every round.

A console can go away under a running job: its terminal closed (writes fail with EIO, as
after ``disown`` and closing the window), or the reader of its pipe left (EPIPE, ``| head``).
The job goes on without it. The lost stream -- and the other one too when both are the same
terminal -- is pointed at ``/dev/null``, so every later write to it (worker lines, phalanx's
own messages, Python's flush at exit) succeeds into nothing instead of failing, and the loss
is said once: to ``on_lost`` (the agent puts it in the event log, since the terminal that
would show it is gone) and as a warning (seen where the other stream still goes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable
from typing import IO, Any, BinaryIO

log = logging.getLogger("phalanx")

NAMES = ("stdout", "stderr")
OnLost = Callable[[list[str], str], None]  # (the streams lost, why)


class _StopKeepingHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A ``StreamHandler`` that lets a stop through. Where phalanx waits on others, a signal
    raises ``Interrupted`` (a ``SystemExit``) from inside whatever runs, a line's write
    included; ``logging`` catches every ``Exception`` there and prints "--- Logging error ---"
    instead, and the stop was lost: the wait went on as if no signal had come."""

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exception(), SystemExit):
            raise  # called from logging's except block: the stop goes on
        super().handleError(record)


def configure_logging() -> None:
    """Launcher messages go to stderr as ``phalanx: ...`` (once, whoever calls first)."""
    if not log.handlers:
        handler = _StopKeepingHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("phalanx: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


class Console:
    def __init__(
        self, streams: tuple[BinaryIO, BinaryIO], on_lost: OnLost = lambda names, why: None
    ) -> None:
        self._streams = streams
        self._lost = [False, False]
        self._on_lost = on_lost

    def write(self, index: int, data: bytes) -> bool:
        """Write and flush ``data`` to stream ``index`` (0 stdout, 1 stderr); False once that
        stream is lost (said once)."""
        if self._lost[index]:
            return False
        stream = self._streams[index]
        try:
            stream.write(data)
            stream.flush()
        except (OSError, ValueError) as exc:  # ValueError: the stream was closed
            self._lose(index, getattr(exc, "strerror", None) or str(exc))
            return False
        return True

    def _lose(self, index: int, why: str) -> None:
        lost = [i for i in (0, 1) if i == index or (not self._lost[i] and self._same(i, index))]
        for i in lost:
            self._lost[i] = True
            _to_devnull(self._streams[i])
        names = [NAMES[i] for i in lost]
        log.warning(
            "the console's %s went away (%s): the job goes on; its output goes to the log "
            "files only", " and ".join(names), why,
        )  # fmt: skip
        self._on_lost(names, why)

    def _same(self, one: int, other: int) -> bool:
        """Whether both streams are the same file (one terminal for stdout and stderr)."""
        try:
            a, b = (os.fstat(self._streams[i].fileno()) for i in (one, other))
        except (OSError, ValueError):
            return False
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def settle(*streams: IO[Any]) -> None:
    """Flush ``streams`` (the launcher's ``sys.stdout``, ``sys.stderr``) before it exits; one
    whose terminal went away is pointed at /dev/null, so Python's own flush at exit cannot
    fail (it would turn the job's exit code into 120)."""
    for stream in streams:
        try:
            stream.flush()
        except (OSError, ValueError):
            _to_devnull(stream)


def _to_devnull(stream: IO[Any]) -> None:
    """Point the stream's descriptor at /dev/null and drop what its buffer holds."""
    with contextlib.suppress(OSError, ValueError):
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
        stream.flush()  # what failed before now goes to /dev/null: nothing is left to fail
