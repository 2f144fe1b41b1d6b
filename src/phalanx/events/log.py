"""Writing and reading ``events.jsonl``.

The agent emits from its own thread; the line is written by a writer thread, so a full disk
or a log filesystem that stops answering costs events, never the job (the same rule as the
report: ``agent.runfiles.write_bounded``). Lines are appended with one ``write`` each to a file
opened ``O_APPEND`` without following symlinks, so a reader sees whole lines, except perhaps
a torn last one, which ``read_events`` skips.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from phalanx.events.kinds import KINDS, SCHEMA_VERSION
from phalanx.worker.nofollow import open_file

log = logging.getLogger("phalanx")

EVENTS_FILE = "events.jsonl"
_CLOSE_WAIT = 2.0  # seconds ``close`` waits for the writer (as long as the report's write)


class EventLog:
    """This agent's event log. ``emit`` never blocks and never raises."""

    def __init__(self, run_dir: Path, wall_clock: Callable[[], float] = time.time) -> None:
        self.path = run_dir / EVENTS_FILE
        self.node: int | None = None  # set by the agent when a round forms
        self._clock = wall_clock
        self._host = socket.gethostname()
        self._seq = 0
        self._numbering = threading.Lock()  # emitted from helper threads too (guardian_lost)
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._lines: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write, name="phalanx-events", daemon=True)
        self._writer.start()

    def listen(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call ``listener`` with every event emitted from now on, in the emitting thread
        (metrics, a status page): it must be quick; an exception is logged, not raised."""
        self._listeners.append(listener)

    def now(self) -> float:
        """The wall clock events are stamped with."""
        return self._clock()

    def emit(self, kind: str, /, **fields: Any) -> None:
        """Append one event of ``kind`` (``KINDS``): its listed fields, null where not given."""
        names = KINDS[kind]  # an unknown kind is a bug here, not a runtime condition
        unknown = set(fields) - set(names)
        if unknown:
            raise TypeError(f"event {kind!r} has no field(s) {sorted(unknown)}")
        with self._numbering:  # seq in file order, whichever thread emits
            record: dict[str, Any] = {
                "v": SCHEMA_VERSION,
                "t": round(self._clock(), 6),
                "mono": round(time.monotonic(), 6),
                "seq": self._seq,
                "node": self.node,
                "host": self._host,
                "kind": kind,
            }
            record.update({name: fields.get(name) for name in names})
            self._seq += 1
            self._lines.put((json.dumps(record, default=str) + "\n").encode())
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:  # a listener's bug must not stop the job
                log.exception("events: a listener failed on %s", kind)

    def close(self) -> None:
        """Write what is queued, waiting at most ``_CLOSE_WAIT`` seconds."""
        self._lines.put(None)
        self._writer.join(_CLOSE_WAIT)
        if self._writer.is_alive():
            log.warning("events: %s did not answer within %g s", self.path, _CLOSE_WAIT)

    def _write(self) -> None:
        """Write each line; a failed write loses that line only. A full disk is often full
        for a while (a log that filled it is rotated, a filler removed): the next lines are
        tried again, and once one is written the log goes on (said in one line, with how
        many were lost). A line cut short by the failure is ended first, so the torn line
        alone is lost, not also the whole one after it."""
        fd: int | None = None
        lost = 0  # lines lost since writing last failed (0: writing works)
        try:
            while (line := self._lines.get()) is not None:
                try:
                    if fd is None:
                        fd = open_file(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                    data = b"\n" + line if lost else line
                    if os.write(fd, data) < len(data):  # the disk filled up within the line
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                except OSError as exc:
                    if not lost:  # one warning per outage; the job goes on without these
                        log.warning("events: cannot write %s (%s)", self.path, exc.strerror or exc)
                    lost += 1
                    continue
                if lost:
                    log.warning("events: writing %s again (%d event(s) lost)", self.path, lost)
                    lost = 0
        finally:
            if fd is not None:
                os.close(fd)


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events in ``path`` in file order; a torn or foreign line is skipped."""
    return list(_parse(path.read_bytes().splitlines()))


def _parse(lines: list[bytes]) -> Iterator[dict[str, Any]]:
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") in KINDS:
            yield record
