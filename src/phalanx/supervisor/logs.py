"""Copying worker output: every byte to the rank's log file, and -- prefixed with the rank,
line by line -- to the launcher's console unless filtered out.

Logging never stops supervision. Each log file is written by a thread of its own
(``LogFile``), so a filesystem that stops answering (a hung NFS mount) never holds up the
loop that watches the workers: the loop only queues. A file that cannot be written (a full
disk, a failing filesystem) or whose writes are stuck for more than ``BACKLOG`` bytes is
reported once and dropped, and the stream goes on to the console. The last ``TAIL_BYTES`` of
each stream are kept in memory, so a failure report quotes the worker's last words even when
its log file could not hold them. Copying is linear for any output shape: a "line" longer
than ``MAX_LINE`` without a newline is emitted in pieces of that size.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import BinaryIO

from phalanx.worker.nofollow import append_to

log = logging.getLogger("phalanx")

TAIL_BYTES = 16384  # what the failure report can quote
MAX_LINE = 65536  # longer runs without a newline go to the console in pieces this long
BACKLOG = 8 << 20  # bytes waiting for a stuck log file before it is given up on
CLOSE_WAIT = 2.0  # seconds all of a round's log files may take to finish writing at the end


class LogFile:
    """An append-only log file written by a thread of its own (see the module docstring).

    ``write`` never blocks: it queues, and returns False once the file has been given up on
    (it could not be opened or written, or its backlog passed ``BACKLOG``), said once.
    """

    def __init__(self, path: os.PathLike[str] | str) -> None:
        self.name = str(path)
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._backlog = 0
        self._given_up = False
        self._thread = threading.Thread(
            target=self._run, name=f"phalanx-log-{os.path.basename(self.name)}", daemon=True
        )  # a daemon: one stuck in the kernel must not keep the launcher from exiting
        self._thread.start()

    def write(self, data: bytes) -> bool:
        with self._lock:
            if self._given_up:
                return False
            if self._backlog > BACKLOG:
                self._give_up("its writes are stuck (is the filesystem answering?)")
                return False
            self._backlog += len(data)
        self._queue.put(data)
        return True

    def close(self) -> None:
        """Ask the thread to finish and close the file (see ``finish``)."""
        self._queue.put(None)

    def finished(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _give_up(self, why: str) -> None:
        """Called with the lock held."""
        if not self._given_up:
            self._given_up = True
            log.warning(
                "cannot write %s (%s): its worker goes on; the rest of this stream goes to "
                "the console only", self.name, why,
            )  # fmt: skip

    def _run(self) -> None:
        try:
            handle = os.fdopen(append_to(self.name), "ab", buffering=0)
        except OSError as exc:
            with self._lock:
                self._give_up(exc.strerror or str(exc))
            return
        with handle:
            while (chunk := self._queue.get()) is not None:
                try:
                    _write_all(handle, chunk)
                except OSError as exc:
                    with self._lock:
                        self._give_up(exc.strerror or str(exc))
                    return
                finally:
                    with self._lock:
                        self._backlog -= len(chunk)


def finish_all(files: Iterable[LogFile], timeout: float = CLOSE_WAIT) -> None:
    """Close every file and wait, ``timeout`` in all, for their writes to finish; a file
    whose writes are stuck is said and left to its (daemon) thread."""
    files = list(files)
    for handle in files:
        handle.close()
    deadline = time.monotonic() + timeout
    for handle in files:
        if not handle.finished(max(0.0, deadline - time.monotonic())):
            log.warning("%s: writes did not finish (is its filesystem answering?)", handle.name)


@dataclass
class LogStream:
    """One pipe (a worker's stdout or stderr) and where its lines go."""

    fd: int
    file: LogFile | None
    prefix: bytes
    console: BinaryIO | None
    duplicate: tuple[LogFile, tuple[bytes, ...]] | None = None
    _partial: bytes = field(default=b"", repr=False)
    _recent: bytearray = field(default_factory=bytearray, repr=False)

    def pump(self) -> bool:
        """Read what is available; return False at end of stream."""
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:
            return True
        if not chunk:
            self._flush_partial()
            return False
        self._recent += chunk
        del self._recent[:-TAIL_BYTES]
        if self.file is not None and not self.file.write(chunk):
            self.file = None
        data = self._partial + chunk  # _partial is under MAX_LINE: linear in the output
        complete, newline, rest = data.rpartition(b"\n")
        lines = complete.split(b"\n") if newline else []
        while len(rest) >= MAX_LINE:
            lines.append(rest[:MAX_LINE])
            rest = rest[MAX_LINE:]
        self._partial = rest
        if lines:
            self._emit(lines)
        return True

    def tail_lines(self, count: int = 20) -> list[str]:
        """The last ``count`` lines of the stream so far (from memory, not the log file)."""
        return bytes(self._recent).decode("utf-8", errors="replace").splitlines()[-count:]

    def _flush_partial(self) -> None:
        if self._partial:
            self._emit([self._partial])
            self._partial = b""

    def _prefixed(self, line: bytes) -> bytes:
        # torch already prefixes some lines with the rank: "[rank0]: " (its excepthook),
        # "[rank0]:[W..." (its C++ warnings); such a line is not prefixed twice.
        return line if line.startswith(self.prefix.rstrip()) else self.prefix + line

    def _emit(self, lines: list[bytes]) -> None:
        if self.duplicate is not None:
            target, words = self.duplicate
            picked = [line for line in lines if any(word in line for word in words)]
            if picked and not target.write(b"".join(self._prefixed(x) + b"\n" for x in picked)):
                self.duplicate = None
        if self.console is None:
            return
        try:
            self.console.write(b"".join(self._prefixed(line) + b"\n" for line in lines))
            self.console.flush()
        except (BrokenPipeError, ValueError):
            # The launcher's own stdout went away (e.g. piped into `head`): keep the files.
            self.console = None


def _write_all(target: BinaryIO, data: bytes) -> None:
    """All of ``data`` to an unbuffered file (a regular file may take it in parts)."""
    view = memoryview(data)
    while view:
        written = target.write(view)
        if not written:
            raise OSError("nothing written")
        view = view[written:]
