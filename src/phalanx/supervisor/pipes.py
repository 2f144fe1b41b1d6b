"""The supervisor's selector, with back-pressure from the log files.

A worker's pipe whose log file is ``logs.LIMIT`` bytes behind is taken out of the selector
(parked) until the file's writer thread says there is room again (a byte on ``wake``'s
socket), so the launcher's memory stays bounded and the worker waits on its write, as it
would on a slow terminal; or until the file has made no progress for ``logs.STALL``
seconds: it is then given up on and the stream goes on to the console. ``draining`` lets
each pipe be read to its end once its workers are gone: what the pipe holds (at most its
capacity) may queue past the limit, so the last bytes of a worker that ended while its file
was behind still reach the file.

Only a pipe that was read can fall behind (its file's writer only catches up), and every read
is of a pipe this selector returned: so each ``select`` looks at the parked pipes and at those
it returned last time, not at every pipe (an idle launcher wakes for nothing else).
"""

from __future__ import annotations

import contextlib
import fcntl
import selectors
import socket
import time
from typing import Any

from phalanx.supervisor.logs import STALL, LogStream

_WAKE = object()  # the key data of the wake-up socket
_PIPE_SIZE = 65536  # Linux's default pipe capacity, where it cannot be asked


class PipeSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        super().register(self._reader.fileno(), selectors.EVENT_READ, _WAKE)
        self._parked: dict[int, selectors.SelectorKey] = {}
        # fd -> the stream's ``read`` up to which it is read even when its file is behind
        self._allowance: dict[int, int] = {}
        self._returned: list[int] = []  # the pipes the last ``select`` returned (read since)
        self._rang = False

    def wake(self) -> None:
        """Look at the parked pipes again (called by a log file's writer thread)."""
        with contextlib.suppress(OSError):  # full: a wake-up is pending already
            self._writer.send(b"\0")

    def ring(self) -> None:
        """Have ``select`` return now and ``rang`` say so (called from another thread)."""
        self._rang = True
        self.wake()

    def rang(self) -> bool:
        """Whether ``ring`` was called since the last look (and forget it)."""
        rang, self._rang = self._rang, False
        return rang

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        parked = self._parked.pop(fd, None)
        return parked if parked is not None else super().unregister(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        """As ``selectors``' own, returning early when a parked pipe may go on."""
        self._balance()
        stalls = [f.stall_deadline() for k in self._parked.values() for f in k.data.files()]
        if stalls:
            wait = max(0.0, min(stalls) - time.monotonic())
            timeout = wait if timeout is None else min(timeout, wait)
        ready = []
        for key, mask in super().select(timeout):
            if key.data is _WAKE:
                with contextlib.suppress(BlockingIOError):
                    while self._reader.recv(4096):
                        pass
            else:
                ready.append((key, mask))
        self._returned = [key.fd for key, _ in ready if isinstance(key.data, LogStream)]
        return ready

    def draining(self) -> None:
        """From now on, read each pipe past the limit by what it may hold now."""
        for key in [*self.get_map().values(), *self._parked.values()]:
            if isinstance(key.data, LogStream):
                self._allowance[key.fd] = key.data.read + _capacity(key.fd)

    def close(self) -> None:
        super().close()
        self._parked.clear()
        self._reader.close()
        self._writer.close()

    def _balance(self) -> None:
        """Park the pipes whose files are behind; let go of those whose are not any more,
        giving up on a file that made no progress for ``STALL`` seconds."""
        for fd, key in list(self._parked.items()):
            for handle in key.data.files():
                if handle.stalled():
                    handle.give_up(f"no progress for {STALL:g} s: is its filesystem answering?")
            if not self._holds(key.data):
                del self._parked[fd]
                super().register(fd, key.events, key.data)
        returned, self._returned = self._returned, []
        for fd in returned:
            found = self.get_map().get(fd)
            if found is not None and isinstance(found.data, LogStream) and self._holds(found.data):
                self._parked[fd] = super().unregister(fd)

    def _holds(self, stream: LogStream) -> bool:
        return stream.read >= self._allowance.get(stream.fd, 0) and stream.behind()


def _capacity(fd: int) -> int:
    try:
        return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    except OSError:
        return _PIPE_SIZE
