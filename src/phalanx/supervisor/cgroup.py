"""A cgroup of the job's own, so that no process the job started outlives it -- not even one
that left its process group and its session (``setsid``).

phalanx signals process groups, which is enough for workers and their ordinary children; a
process that calls ``setsid()`` leaves its group, but never its cgroup. Where the agent can
make a child of its own cgroup (root, or a delegated subtree: cgroup v2, else v1's ``pids``
hierarchy), it moves itself into one before it starts anything, so every process of the job
is born there. At the end the cgroup is emptied -- by the guardian when the agent died, even
by SIGKILL, and by the agent itself when it leaves normally -- and removed. Where no cgroup
can be made, the process groups are all there is (the README says which holds where).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("phalanx")

EMPTY_WAIT = 2.0  # seconds to see every member gone after SIGKILL (a D-state one may stay)


def hierarchies() -> list[Path]:
    """This process's cgroup directory in each usable hierarchy: v2 first, then v1 pids."""
    mounts: dict[str, Path] = {}  # "2" or "pids" -> mount point
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as info:
        for line in info:
            fields = line.split()
            kind = fields[fields.index("-") + 1]
            options = fields[-1].split(",")
            if kind == "cgroup2":
                mounts.setdefault("2", Path(fields[4]))
            elif kind == "cgroup" and "pids" in options:
                mounts.setdefault("pids", Path(fields[4]))
    found: dict[str, Path] = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as own:
        for line in own:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            key = "2" if number == "0" else ("pids" if "pids" in controllers.split(",") else "")
            if key in mounts:
                found[key] = mounts[key] / path.lstrip("/")
    return [found[key] for key in ("2", "pids") if key in found]


def members(path: Path) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
    return []


def kill_members(path: Path, keep: frozenset[int]) -> list[int]:
    """SIGKILL every process in the cgroup ``path`` but ``keep`` until none is left (at most
    ``EMPTY_WAIT``); returns the ones still there (a process stuck in the kernel)."""
    deadline = time.monotonic() + EMPTY_WAIT
    while True:
        left = [pid for pid in members(path) if pid not in keep]
        if not left or time.monotonic() >= deadline:
            return left
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


@dataclass(frozen=True)
class JobCgroup:
    path: Path  # the job's cgroup
    parent: Path  # the agent's cgroup before, where it goes back

    @classmethod
    def enter(cls, name: str) -> JobCgroup | None:
        """Make the cgroup ``name`` beside nothing else of ours, under this process's own,
        and move this process into it; None (said at debug level) where that cannot be."""
        for parent in hierarchies():
            path = parent / name
            try:
                path.mkdir()
            except OSError as exc:
                log.debug("no job cgroup under %s: %s", parent, exc)
                continue
            try:
                (path / "cgroup.procs").write_text(f"{os.getpid()}\n")
            except OSError as exc:
                log.debug("cannot enter the job cgroup %s: %s", path, exc)
                with contextlib.suppress(OSError):
                    path.rmdir()
                continue
            return cls(path, parent)
        return None

    def leave(self) -> None:
        """Move this process back, end every process still in the cgroup, remove it."""
        with contextlib.suppress(OSError):
            (self.parent / "cgroup.procs").write_text(f"{os.getpid()}\n")
        stuck = kill_members(self.path, frozenset())
        if stuck:
            log.warning("processes %s of this job could not be ended (stuck in the kernel)", stuck)
        with contextlib.suppress(OSError):
            self.path.rmdir()
