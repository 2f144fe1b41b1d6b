"""The agent's hold on its workers' progress counters (``phalanx.worker.progress``).

Each worker's counters are a memfd this agent makes just before it starts the worker and
links from the rank's directory; the agent holds the descriptor until the next worker of
the same rank directory replaces it, or the run ends, so the counters can still be read
after their worker ended (the crash-loop verdict, the attempt's last step).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from phalanx.worker import progress

log = logging.getLogger("phalanx")


class Counters:
    def __init__(self) -> None:
        self._held: dict[str, int] = {}  # rank directory -> the memfd its link leads to

    def make(self, rank_dir: Path) -> None:
        """New counters for the worker about to start in ``rank_dir``. Where they cannot be
        made the worker says so itself, once; the last ones stay held, since the link may
        still lead to them (a descriptor closed under a link could be reused by anything)."""
        key = str(rank_dir)
        try:
            fd = progress.make_counters(key)
        except OSError as exc:
            log.debug("no progress counters in %s: %s", rank_dir, exc)
            return
        old = self._held.pop(key, None)
        self._held[key] = fd
        if old is not None:
            os.close(old)

    def close(self) -> None:
        for fd in self._held.values():
            os.close(fd)
        self._held.clear()
