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
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("phalanx")

EMPTY_WAIT = 2.0  # seconds to see every member gone after SIGKILL (a D-state one may stay)
# A member SIGKILLed and still in uninterruptible sleep this long is stuck (a hung mount): the
# rest of EMPTY_WAIT would not end it, so the launcher's exit does not wait for it.
STUCK_AFTER = 0.2
# What a job's cgroup is called: "phalanx-" + its run directory's name (run id, "_", 8 hex
# digits). Only such names are swept: never a cgroup someone else named "phalanx-...".
RUN_CGROUP = re.compile(r"phalanx-.+_[0-9a-f]{8}")


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
    start = time.monotonic()
    deadline = start + EMPTY_WAIT
    awake = start  # the last time a member was seen in any state but D
    while True:
        left = [pid for pid in members(path) if pid not in keep]
        now = time.monotonic()
        if not all(_in_disk_sleep(pid) for pid in left):
            awake = now
        if not left or now >= deadline or now - awake >= STUCK_AFTER:
            return left
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _in_disk_sleep(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] == b"D"
    except (OSError, IndexError):
        return False


def sweep(parent: Path) -> list[Path]:
    """Remove the empty job cgroups (``phalanx-<run dir>``) under ``parent``; returns them.
    They are left by a run whose worker was stuck in the kernel past the run's end, or whose
    agent and guardian both died.
    The kernel itself refuses to remove a cgroup that still has a process or a child cgroup,
    so a live run's (its agent is in it) and one still holding a stuck process stay."""
    removed: list[Path] = []
    with contextlib.suppress(OSError):
        for path in parent.glob("phalanx-*"):
            if not RUN_CGROUP.fullmatch(path.name) or not (path / "cgroup.procs").exists():
                continue
            if not members(path):
                try:
                    path.rmdir()
                except OSError:
                    continue
                removed.append(path)
    if removed:
        log.debug("removed empty cgroups left by earlier runs: %s", removed)
    return removed


@dataclass(frozen=True)
class JobCgroup:
    path: Path  # the job's cgroup
    parent: Path  # the agent's cgroup before, where it goes back

    @classmethod
    def enter(cls, name: str) -> JobCgroup | None:
        """Make the cgroup ``name`` beside nothing else of ours, under this process's own,
        and move this process into it; None (said at debug level) where that cannot be.
        First the empty ``phalanx-*`` cgroups earlier runs left are swept, in every hierarchy."""
        parents = hierarchies()
        for parent in parents:
            sweep(parent)
        for parent in parents:
            path = parent / name
            try:
                path.mkdir()
            except OSError as exc:
                log.debug("no job cgroup under %s: %s", parent, exc)
                continue
            try:
                # Between mkdir and this write the cgroup is empty: another run's sweep may
                # remove it (ENOENT); then it is made again, once.
                for last in (False, True):
                    try:
                        (path / "cgroup.procs").write_text(f"{os.getpid()}\n")
                        break
                    except FileNotFoundError:
                        if last:
                            raise
                        path.mkdir()
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
