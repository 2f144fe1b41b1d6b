"""The run directory's small files (``launcher.json``, ``report.json``), written by one thread
of the agent's own, so that no reaction of the agent (joining, a restart, a stop) waits for
the run directory's filesystem: a struggling NFS mount answers each operation in a second.

``offer`` hands over a file's newest content and returns at once; a file offered again
before it was written is written once, with the newest content (a slow disk costs
freshness, never the caller's time). ``close`` writes what is left by a deadline, the
report last, with whatever time remains, and says on stderr (the log) which file could not
be written in time. Files are written whole and atomically (``replace_file``: a temporary
file renamed into place, never through a symlink), the run directory opened once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from phalanx.worker.nofollow import open_dir, replace_in

log = logging.getLogger("phalanx")

REPORT_FILE = "report.json"
# Seconds the agent's end waits for the run directory's last writes (the event log, status
# and these files), whatever its filesystem does: the report gets what remains of them.
END_WRITES = 15.0


class RunFiles:
    """The writer of one run directory's small files. ``offer`` never blocks or raises."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._waiting: dict[str, bytes] = {}  # file name -> newest content, in offer order
        self._busy: str | None = None  # the file being written now
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="phalanx-runfiles", daemon=True)
        self._thread.start()

    def offer(self, name: str, data: bytes) -> None:
        """Have ``run_dir/name`` hold ``data`` (the report is always written last)."""
        with self._lock:
            self._waiting.pop(name, None)  # to the end of the queue: the newest is written
            self._waiting[name] = data
            if REPORT_FILE in self._waiting and name != REPORT_FILE:
                self._waiting[REPORT_FILE] = self._waiting.pop(REPORT_FILE)
            self._wake.notify()

    def close(self, deadline: float) -> None:
        """Write what is waiting until ``deadline`` (``time.monotonic``); name on the log
        each file not written by then (its filesystem did not answer in time)."""
        with self._lock:
            self._closing = True
            self._wake.notify()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            late = [n for n in (self._busy, *self._waiting) if n is not None]
        for name in late:  # the thread goes on, until the process exits
            log.warning(
                "cannot write %s (its filesystem did not answer within %g s of the job's end)",
                self.run_dir / name, END_WRITES,
            )  # fmt: skip

    def _next(self) -> tuple[str, bytes] | None:
        with self._lock:
            self._busy = None
            while not self._waiting and not self._closing:
                self._wake.wait()
            if not self._waiting:
                return None
            name = next(iter(self._waiting))
            self._busy = name
            return name, self._waiting.pop(name)

    def _run(self) -> None:
        dir_fd: int | None = None  # the run directory, opened once (never through a symlink)
        try:
            while (item := self._next()) is not None:
                name, data = item
                try:
                    if dir_fd is None:
                        dir_fd = open_dir(self.run_dir)
                    replace_in(dir_fd, name, data)
                except OSError as exc:  # a full or read-only disk: that file is lost, not the job
                    log.warning("cannot write %s (%s)", self.run_dir / name, exc.strerror or exc)
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
