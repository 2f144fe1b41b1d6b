"""A CPU quota for one test "node": a cgroup of the test's own whose processes may use only
``fraction`` of one core, made and removed by the test (root only).

cgroup v1 (a ``cpu`` hierarchy: ``cpu.cfs_period_us`` + ``cpu.cfs_quota_us``) where it is
mounted, as on these machines; else cgroup v2 (``cpu.max``, with the ``cpu`` controller
enabled in the parent's ``cgroup.subtree_control``). A process enters it before it execs
the node's command (``wrap``), so the agent and every worker it starts are born under it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

PERIOD_US = 100_000
V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "a CPU quota needs root (a cgroup of the test's own)"
    if (V1 / "cpu.cfs_quota_us").exists():
        return None
    controllers = V2 / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return None
    return "no cgroup cpu controller (v1 cpu hierarchy, or v2 with cpu) is mounted"


class CpuQuota:
    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        name = f"phx-quota-{os.getpid()}-{time.monotonic_ns()}"
        self.v1 = (V1 / "cpu.cfs_quota_us").exists()
        self.path = (V1 if self.v1 else V2) / name

    def create(self) -> None:
        quota = int(PERIOD_US * self.fraction)
        if self.v1:
            self.path.mkdir()
            (self.path / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            (self.path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
            return
        with contextlib.suppress(OSError):  # already enabled, or enabled by someone else
            (V2 / "cgroup.subtree_control").write_text("+cpu\n")
        self.path.mkdir()
        (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the cgroup: the shell enters it, then execs ``argv``."""
        enter = f'echo $$ > {self.path / "cgroup.procs"} && exec "$@"'
        return ["sh", "-c", enter, "sh", *argv]

    def enter(self, pid: int) -> None:
        """Move running process ``pid`` (all its threads) into the cgroup: throttled from now."""
        (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def lift(self) -> None:
        """No quota from now on for what is in the cgroup (the slow node is slow no more):
        a test whose fault has done its part lets the rest of the job run at full speed."""
        if self.v1:
            (self.path / "cpu.cfs_quota_us").write_text("-1\n")
        else:
            (self.path / "cpu.max").write_text(f"max {PERIOD_US}\n")

    def destroy(self) -> None:
        """Kill what is left in it (only the test's own processes are ever put there), then
        remove it. Idempotent."""
        if not self.path.exists():
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            self.path.rmdir()
