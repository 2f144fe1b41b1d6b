"""Copying worker output: every byte to the rank's log file, and -- prefixed with the rank,
line by line -- to the launcher's console unless filtered out.

Logging never stops supervision. Each log file is written by a thread of its own
(``LogFile``), so a filesystem that stops answering (a hung NFS mount) never holds up the
loop that watches the workers: the loop only queues. A file is never dropped for being
behind: once ``LIMIT`` bytes wait for it, its pipe is read no further until it catches up
(``supervisor.pipes``), so the worker waits on its write as it would on a slow terminal, and
every byte reaches the file. A file that cannot be written (a full disk, a failing
filesystem) or whose writes make no progress for ``STALL`` seconds is reported once and
dropped, and the stream goes on to the console. The last ``TAIL_BYTES`` of each stream are
kept in memory, so a failure report quotes the worker's last words even when its log file
could not hold them. Copying is linear for any output shape: a "line" longer than
``MAX_LINE`` without a newline is emitted in pieces of that size.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import BinaryIO

from phalanx.supervisor.console import Console
from phalanx.worker.nofollow import append_to, make_dirs

log = logging.getLogger("phalanx")

TAIL_BYTES = 16384  # what the failure report can quote
MAX_LINE = 65536  # longer runs without a newline go to the console in pieces this long
LIMIT = 1 << 20  # bytes waiting for one log file before its pipe is read no further
STALL = 10.0  # seconds a log file with writes waiting may make no progress before it is dropped


class LogFile:
    """An append-only log file written by a thread of its own (see the module docstring).

    ``write`` never blocks: it queues, and returns False once the file has been given up on
    (it could not be opened or written, or it made no progress for ``STALL`` seconds), said
    once. The reader keeps the queue bounded by asking ``behind`` before reading more;
    ``wake`` is called (from the writer thread) when a file that was behind has room again.
    """

    def __init__(
        self, path: os.PathLike[str] | str, wake: Callable[[], None] | None = None
    ) -> None:
        self.name = str(path)
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._backlog = 0
        self._progress_at = time.monotonic()  # the last write done, or asked of an idle file
        self._wake = wake
        self._waited_on = False  # a reader stopped for this file: wake it when there is room
        self._given_up = False
        self._thread = threading.Thread(
            target=self._run, name=f"phalanx-log-{os.path.basename(self.name)}", daemon=True
        )  # a daemon: one stuck in the kernel must not keep the launcher from exiting
        self._thread.start()

    def write(self, data: bytes) -> bool:
        with self._lock:
            if self._given_up:
                return False
            if not self._backlog:
                self._progress_at = time.monotonic()  # an idle file's clock starts now
            self._backlog += len(data)
        self._queue.put(data)
        return True

    def behind(self) -> bool:
        """Whether ``LIMIT`` bytes or more wait for the file (read no more for it until
        ``wake``); False once it has been given up on."""
        with self._lock:
            if self._given_up or self._backlog < LIMIT:
                return False
            self._waited_on = True
            return True

    def stall_deadline(self) -> float:
        """The ``time.monotonic()`` at which the file is given up on unless it progresses."""
        with self._lock:
            return self._progress_at + STALL

    def stalled(self) -> bool:
        """Whether the file has made no progress for ``STALL`` seconds (and is not given up)."""
        with self._lock:
            return not self._given_up and time.monotonic() >= self._progress_at + STALL

    def give_up(self, why: str | None) -> None:
        """Write no more to the file; ``why`` is said (once), None says nothing."""
        with self._lock:
            self._give_up(why)

    def written(self) -> bool:
        """Whether every byte handed to it was written (or it gave up)."""
        with self._lock:
            return self._backlog == 0 or self._given_up

    @property
    def given_up(self) -> bool:
        return self._given_up

    def close(self) -> None:
        """Ask the thread to finish and close the file (see ``finish_all``)."""
        with self._lock:
            if not self._backlog:
                self._progress_at = time.monotonic()  # closing is asked of it now
        self._queue.put(None)

    def finished(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _give_up(self, why: str | None) -> None:
        """Called with the lock held."""
        if not self._given_up:
            self._given_up = True
            if why is not None:
                log.warning(
                    "cannot write %s (%s): its worker goes on; the rest of this stream goes "
                    "to the console only", self.name, why,
                )  # fmt: skip

    def _run(self) -> None:
        try:
            # Its directory may still be on its way (``slot.make_log_dir`` waits a bounded
            # time for a slow run directory): made here too, never through a symlink.
            make_dirs(os.path.dirname(self.name))
            handle = os.fdopen(append_to(self.name), "ab", buffering=0)
        except OSError as exc:
            self._fail(exc)
            return
        with handle:
            while (chunk := self._queue.get()) is not None:
                try:
                    _write_all(handle, chunk)
                except OSError as exc:
                    self._fail(exc)
                    return
                with self._lock:
                    self._backlog -= len(chunk)
                    self._progress_at = time.monotonic()
                    room = self._waited_on and self._backlog <= LIMIT // 2
                    if room:
                        self._waited_on = False
                if room and self._wake is not None:
                    self._wake()

    def _fail(self, exc: OSError) -> None:
        with self._lock:
            self._give_up(exc.strerror or str(exc))
        if self._wake is not None:
            self._wake()  # a reader stopped for this file goes on to the console


def finish_all(files: Iterable[LogFile]) -> None:
    """Close every file and wait for their writes to finish, as long as each makes progress;
    one that makes none for ``STALL`` seconds is said and left to its (daemon) thread. A file
    with no bytes waiting is not waited for (on a slow run directory its thread may still be
    opening it: a worker's stop or restart does not wait for that)."""
    files = list(files)
    for handle in files:
        handle.close()
    for handle in files:
        if handle.written():
            continue  # nothing left to lose: a thread still opening it is not waited for
        while not handle.finished(max(0.0, handle.stall_deadline() - time.monotonic())):
            if handle.given_up:
                break  # said already; its thread is stuck in the kernel
            if handle.stalled():
                handle.give_up(None)
                log.warning(
                    "%s: writes did not finish (no progress for %g s: is its filesystem "
                    "answering?)", handle.name, STALL,
                )  # fmt: skip
                break


@dataclass
class LogStream:
    """One pipe (a worker's stdout or stderr) and where its lines go."""

    fd: int
    file: LogFile | None
    prefix: bytes
    console: tuple[Console, int] | None  # the console and which of its streams
    duplicate: tuple[LogFile, tuple[bytes, ...]] | None = None
    _partial: bytes = field(default=b"", repr=False)
    _recent: bytearray = field(default_factory=bytearray, repr=False)
    read: int = 0  # bytes read from the pipe so far

    def files(self) -> list[LogFile]:
        """The log files this stream still writes to."""
        return [f for f in (self.file, self.duplicate and self.duplicate[0]) if f is not None]

    def behind(self) -> bool:
        """Whether one of its files is ``LIMIT`` bytes behind: read no more until it is not."""
        return any([f.behind() for f in self.files()])  # asks each: each wakes its reader

    def pump(self) -> bool:
        """Read what is available; return False at end of stream."""
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:
            return True
        if not chunk:
            self._flush_partial()
            return False
        self.read += len(chunk)
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
        console, index = self.console
        if not console.write(index, b"".join(self._prefixed(line) + b"\n" for line in lines)):
            self.console = None  # it went away (a closed terminal, `| head`): keep the files


def _write_all(target: BinaryIO, data: bytes) -> None:
    """All of ``data`` to an unbuffered file (a regular file may take it in parts)."""
    view = memoryview(data)
    while view:
        written = target.write(view)
        if not written:
            raise OSError("nothing written")
        view = view[written:]
