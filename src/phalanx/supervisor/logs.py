"""Copying worker output: every byte to the rank's log file, and -- prefixed with the rank,
line by line -- to the launcher's console unless filtered out.

Logging never stops supervision: a log file that cannot be written (a full disk, a failing
filesystem) is reported once and dropped, and the stream goes on to the console. The last
``TAIL_BYTES`` of each stream are kept in memory, so a failure report quotes the worker's
last words even when its log file could not hold them. Copying is linear for any output
shape: a "line" longer than ``MAX_LINE`` without a newline is emitted in pieces of that size.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import BinaryIO

log = logging.getLogger("phalanx")

TAIL_BYTES = 16384  # what the failure report can quote
MAX_LINE = 65536  # longer runs without a newline go to the console in pieces this long


@dataclass
class LogStream:
    """One pipe (a worker's stdout or stderr) and where its lines go."""

    fd: int
    file: BinaryIO | None
    prefix: bytes
    console: BinaryIO | None
    duplicate: tuple[BinaryIO, tuple[bytes, ...]] | None = None
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
        if self.file is not None and not _write(self.file, chunk):
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
        # torch.distributed's excepthook already prefixes tracebacks with "[rankN]: ".
        return line if line.startswith(self.prefix) else self.prefix + line

    def _emit(self, lines: list[bytes]) -> None:
        if self.duplicate is not None:
            target, words = self.duplicate
            picked = [line for line in lines if any(word in line for word in words)]
            if picked and not _write(target, b"".join(self._prefixed(x) + b"\n" for x in picked)):
                self.duplicate = None
        if self.console is None:
            return
        try:
            self.console.write(b"".join(self._prefixed(line) + b"\n" for line in lines))
            self.console.flush()
        except (BrokenPipeError, ValueError):
            # The launcher's own stdout went away (e.g. piped into `head`): keep the files.
            self.console = None


def open_log(path: os.PathLike[str] | str) -> BinaryIO | None:
    """A log file to append to, unbuffered (each write reaches the file or fails there, never
    later in a flush or a close); None, said once, when it cannot be opened."""
    try:
        return open(path, "ab", buffering=0)
    except OSError as exc:
        log.warning("cannot open %s (%s): this stream goes to the console only", path, exc.strerror)
        return None


def _write(target: BinaryIO, data: bytes) -> bool:
    """Write all of ``data`` to an unbuffered file; False (said once, here) when it failed."""
    try:
        view = memoryview(data)
        while view:
            written = target.write(view)
            view = view[written or 0 :]
            if not written:
                raise OSError("nothing written")
    except OSError as exc:
        log.warning(
            "cannot write %s (%s): its worker goes on; the rest of this stream goes to the "
            "console only",
            getattr(target, "name", "a log file"),
            exc.strerror or exc,
        )
        return False
    return True
