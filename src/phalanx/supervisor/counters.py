"""The agent's hold on its workers' progress counters (``phalanx.worker.progress``).

Each worker's counters are a memfd this agent makes just before it starts the worker and
links from the rank's directory; the agent holds the descriptor until the next round's
workers start, or the run ends, so the counters can still be read after their worker ended
(the crash-loop verdict, the attempt's last step). When the next round starts (``retire``),
the counters of every rank directory it does not reuse (the last attempt's) are let go: the
link is replaced by a plain 16-byte file with the last counts and the descriptor closed.
(They were held for the whole run: one descriptor per rank per restart, 25 -> 37 over a
soak's twelve restarts, and a job restarted a thousand times held a thousand.) When the run
ends, each link still held is replaced the same way (from a thread, waited for at most
``_FINAL_WAIT`` s: a run directory that stopped answering costs them, never the exit), so
the run directory left behind holds no link to a descriptor that is gone (a copy of it,
``shutil.copytree``, would fail on one) or, in a process that goes on (``phalanx.spawn``),
to a number reused since.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path

from phalanx.worker import progress
from phalanx.worker.nofollow import open_dir, replace_file

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

    def retire(self, keep: Iterable[Path]) -> None:
        """The next round starts with ``keep``'s rank directories: the counters of every
        other one held (the ranks of an earlier attempt, whose workers are gone) become a
        plain file of their last counts and their descriptor is closed. Where neither that
        file nor the link's removal can be done (a read-only run directory), they stay held:
        a descriptor closed under a link could be reused by anything. In this thread, as
        ``make`` links the new ones: a few small writes in the same directories."""
        kept = {str(rank_dir) for rank_dir in keep}
        for rank_dir in [d for d in self._held if d not in kept]:
            if _let_go(Path(rank_dir), self._held[rank_dir]):
                del self._held[rank_dir]

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


def _let_go(rank_dir: Path, fd: int) -> bool:
    """Replace ``rank_dir``'s link to ``fd`` by a plain file of its last counts or, where
    that cannot be written (a full disk), remove the link; then close ``fd``. False: neither
    could be done, ``fd`` is still held (and read)."""
    data = os.pread(fd, progress.LAYOUT.size, 0)
    try:
        replace_file(rank_dir / progress.FILE_NAME, data)
    except OSError as exc:
        log.debug("progress counters not kept in %s: %s", rank_dir, exc)
        if not _unlink(rank_dir):
            return False
    progress.hold(str(rank_dir), None)
    os.close(fd)
    return True


def _unlink(rank_dir: Path) -> bool:
    """Remove ``rank_dir``'s counters link (a symlink on the way is refused, not followed);
    True when it is gone (or the directory is)."""
    try:
        where = open_dir(rank_dir)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        os.unlink(progress.FILE_NAME, dir_fd=where)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    finally:
        os.close(where)
    return True
