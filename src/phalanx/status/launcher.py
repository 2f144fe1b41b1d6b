"""The agent of a run directory, from its ``launcher.json``: which process it is, and
whether that process is still the agent (a pid can be reused once the agent has ended).

The agent writes its pid, host and its process's start time (``psutil``'s
``create_time``); a process counts as the agent only when its pid exists on this host and
started at that time. A file from before the start time was recorded falls back to
"the process catches the stacks signal", as ``phalanx stacks`` checks.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from phalanx.worker.contract import STACK_SIGNAL

LAUNCHER_FILE = "launcher.json"
_SAME_START = 1.0  # seconds: create_time is rebuilt from the boot time, which may shift


@dataclass(frozen=True)
class Launcher:
    pid: int
    host: str
    started: float | None  # the process's create_time, when recorded

    @property
    def here(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> bool:
        """Whether the agent still runs (on this host: a run of another host is not known)."""
        if not self.here:
            return False
        import psutil  # here, not at every launch's start (the agent only writes its file)

        from phalanx.hang.stacks import catches

        try:
            process = psutil.Process(self.pid)
            started = process.create_time()
            if process.status() == psutil.STATUS_ZOMBIE:
                return False  # it ended; its parent has not collected its exit yet
        except (psutil.Error, OSError):
            return False
        if self.started is None:
            return catches(self.pid, STACK_SIGNAL)
        return abs(started - self.started) < _SAME_START


def this_process() -> dict[str, object]:
    """What the agent writes about itself in ``launcher.json``."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": started()}


def started() -> float:
    """This process's start time as psutil's ``create_time`` computes it (the boot time plus
    its start in clock ticks), read from ``/proc`` without importing psutil, which the agent
    would otherwise import for this alone at every launch's start (8 ms)."""
    with open("/proc/self/stat") as stat:
        # field 22, starttime; the fields after the command's ")" start at field 3
        ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as system:
        boot = next(int(line.split()[1]) for line in system if line.startswith("btime "))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def read_launcher(run_dir: Path) -> Launcher | None:
    """The agent of ``run_dir``; None when its file is missing or malformed."""
    try:
        data = json.loads((run_dir / LAUNCHER_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    pid, host, started = data.get("pid"), data.get("host"), data.get("started")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not isinstance(host, str):
        return None
    return Launcher(pid, host, float(started) if isinstance(started, (int, float)) else None)


def holders(run_dir: Path, name: str) -> list[int]:
    """Pids of this user's processes on this host that hold ``run_dir/name`` open, even
    after the file was deleted (``/proc/<pid>/fd``; psutil's ``open_files`` leaves deleted
    files out). How a run whose directory is gone still finds its agent: it keeps its
    ``events.jsonl`` open."""
    import psutil

    target = os.path.join(os.path.abspath(run_dir), name)
    found = []
    for pid in psutil.pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds}
        except OSError:  # another user's process, or one that ended meanwhile
            continue
        if target in links or f"{target} (deleted)" in links:
            found.append(pid)
    return found
