"""The agent's hold on its workers' progress counters (``phalanx.worker.progress``).

Each worker's counters are a memfd this agent makes just before it starts the worker and
links from the rank's directory; the agent holds the descriptor until the next worker of
the same rank directory replaces it, or the run ends, so the counters can still be read
after their worker ended (the crash-loop verdict, the attempt's last step). When the run
ends, each link is replaced by a plain 16-byte file with the last counts (from a thread,
waited for at most ``_FINAL_WAIT`` s: a run directory that stopped answering costs them,
never the exit), so the run directory left behind holds no link to a descriptor that is
gone (a copy of it, ``shutil.copytree``, would fail on one) or, in a process that goes
on (``phalanx.spawn``), to a number reused since.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from phalanx.worker import progress
from phalanx.worker.nofollow import replace_file

log = logging.getLogger("phalanx")
_FINAL_WAIT = 2.0  # s, as the report's write (``agent.runfiles.write_bounded``)


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
        progress.hold(key, fd)  # this agent reads them from the descriptor from now on
        if old is not None:
            os.close(old)

    def close(self) -> None:
        """The run ended: the last counts as plain files in place of the links."""
        final = {}
        for rank_dir, fd in self._held.items():
            progress.hold(rank_dir, None)
            try:
                final[Path(rank_dir) / progress.FILE_NAME] = os.pread(fd, progress.LAYOUT.size, 0)
            finally:
                os.close(fd)
        self._held.clear()

        def write() -> None:
            for path, data in final.items():
                try:
                    replace_file(path, data)  # the link itself replaced, never followed
                except OSError as exc:
                    log.debug("progress counters not kept in %s: %s", path, exc)

        writer = threading.Thread(target=write, name="phalanx-counters", daemon=True)
        writer.start()
        writer.join(_FINAL_WAIT)
