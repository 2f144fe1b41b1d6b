"""Every host's console on the controller's: each line as the agent wrote it (rank prefixes
included) behind the host's name; the job-wide failure report, which every agent prints,
shown once (the first to arrive; they describe the same job) and without a host name."""

from __future__ import annotations

import threading
from typing import IO

REPORT_FRAME = "=" * 78  # report.exits.format_report's rule (its default width) around the report


class Console:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._report_owner: object | None = None  # the stream whose report is shown
        self.report_shown = False

    def relay(self, name: str, source: IO[bytes], sink: IO[str]) -> None:
        """Copy ``source`` line by line until it ends (run in a thread per stream)."""
        in_report = False
        for raw in iter(source.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            with self._lock:
                if line == REPORT_FRAME:
                    in_report = not in_report
                    if in_report and self._report_owner is None:
                        self._report_owner = source
                    show_report = self._report_owner is source
                    if show_report:
                        sink.write(line + "\n")
                        sink.flush()
                    if not in_report and show_report:
                        self.report_shown = True
                    continue
                if in_report:
                    if self._report_owner is source:
                        sink.write(line + "\n")
                        sink.flush()
                    continue
                sink.write(f"{name}: {line}\n")
                sink.flush()
