"""A file rewritten now and then by a thread of its own: the caller never waits for the disk.

``offer`` hands over the newest content and returns at once; the thread writes it
atomically (``replace_file``: a temporary file renamed into place, never through a
symlink). While a write is stuck (a hung filesystem), newer offers replace the one
waiting, so a slow disk costs freshness, never the job's time or memory.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from phalanx.worker.nofollow import replace_file

log = logging.getLogger("phalanx")


class LatestWriter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._waiting: bytes | None = None
        self._closing = False
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="phalanx-status", daemon=True)
        self._thread.start()

    def offer(self, data: bytes) -> None:
        with self._lock:
            self._waiting = data
            self._wake.notify()

    def close(self, timeout: float = 2.0) -> None:
        """Write what is waiting, at most ``timeout`` seconds (the report's rule)."""
        with self._lock:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("cannot write %s (its filesystem did not answer)", self.path)

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._waiting is None and not self._closing:
                    self._wake.wait()
                data, self._waiting = self._waiting, None
                closing = self._closing
            if data is not None:
                try:
                    replace_file(self.path, data)
                except OSError as exc:
                    if not self._warned:  # once: the job goes on without it
                        self._warned = True
                        log.warning("cannot write %s (%s)", self.path, exc.strerror or exc)
            if closing:
                with self._lock:
                    if self._waiting is None:
                        return
