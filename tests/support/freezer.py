"""A process put in uninterruptible sleep (state D) for real, by the cgroup-v1 freezer."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from support.launch import alive, wait_for


@contextlib.contextmanager
def frozen(pid: int, name: str) -> Iterator[None]:
    """``pid`` frozen by the cgroup-v1 freezer: it sleeps in the kernel (state D) and even
    SIGKILL waits until it is thawed, as with a hung NFS mount. Thawed and removed after."""
    group = Path("/sys/fs/cgroup/freezer") / name
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(pid))
        (group / "freezer.state").write_text("FROZEN")
        wait_for(lambda: (group / "freezer.state").read_text().strip() == "FROZEN", 10, "frozen")
        yield
    finally:
        (group / "freezer.state").write_text("THAWED")
        wait_for(lambda: not alive(pid), 10, "the thawed process to die of its pending SIGKILL")
        group.rmdir()
