"""Copying worker output: every line to the rank's log file, and -- prefixed with the rank --
to the launcher's console unless filtered out."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import BinaryIO


@dataclass
class LogStream:
    """One pipe (a worker's stdout or stderr) and where its lines go."""

    fd: int
    file: BinaryIO
    prefix: bytes
    console: BinaryIO | None
    duplicate: tuple[BinaryIO, tuple[bytes, ...]] | None = None
    _partial: bytes = field(default=b"", repr=False)

    def pump(self) -> bool:
        """Read what is available; return False at end of stream."""
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:
            return True
        if not chunk:
            self._flush_partial()
            return False
        self.file.write(chunk)
        self.file.flush()
        data = self._partial + chunk
        complete, _, self._partial = data.rpartition(b"\n")
        if complete:
            self._emit(complete.split(b"\n"))
        return True

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
            if picked:
                target.write(b"".join(self._prefixed(line) + b"\n" for line in picked))
                target.flush()
        if self.console is None:
            return
        try:
            self.console.write(b"".join(self._prefixed(line) + b"\n" for line in lines))
            self.console.flush()
        except (BrokenPipeError, ValueError):
            # The launcher's own stdout went away (e.g. piped into `head`): keep the files.
            self.console = None


def tail_lines(path: os.PathLike[str] | str, count: int = 20, max_bytes: int = 16384) -> list[str]:
    """The last ``count`` lines of a file, read from its end."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-count:]
