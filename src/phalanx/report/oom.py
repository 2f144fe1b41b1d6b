"""Out-of-memory evidence for a worker killed by SIGKILL (best effort, read-only).

Two sources, either is enough:

- the memory cgroup of the agent (its workers share it unless something moved them): the
  ``oom_kill`` count in ``memory.events`` (cgroup v2) or ``memory.oom_control`` (v1), read
  when the round starts and again when a worker dies by SIGKILL;
- the kernel log (``/dev/kmsg``, readable by root or with CAP_SYSLOG): a line saying the OOM
  killer killed that pid.

Nothing here raises: a file that cannot be read is no evidence.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path

_MAX_KMSG_RECORDS = 100_000


def memory_cgroup_counter(proc: Path = Path("/proc/self")) -> Path | None:
    """The file holding this process's cgroup ``oom_kill`` count, if the memory controller
    is mounted: v2's ``memory.events`` or v1's ``memory.oom_control``."""
    try:
        cgroups = (proc / "cgroup").read_text().splitlines()
        mounts = (proc / "mountinfo").read_text().splitlines()
    except OSError:
        return None
    paths: dict[str, str] = {}  # "v2" or "v1" -> the cgroup path
    for line in cgroups:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            paths.setdefault("v2", path)
        elif "memory" in controllers.split(","):
            paths["v1"] = path
    for line in mounts:
        # id parent major:minor root mountpoint options ... - fstype source superoptions
        fields, _, tail = line.partition(" - ")
        parts, extra = fields.split(), tail.split()
        if len(parts) < 5 or len(extra) < 3:
            continue
        root, mountpoint, fstype = parts[3], parts[4], extra[0]
        if fstype == "cgroup2" and "v2" in paths:
            candidate = _under(mountpoint, root, paths["v2"]) / "memory.events"
        elif fstype == "cgroup" and "memory" in extra[2].split(",") and "v1" in paths:
            candidate = _under(mountpoint, root, paths["v1"]) / "memory.oom_control"
        else:
            continue
        if candidate.is_file():
            return candidate
    return None


def _under(mountpoint: str, root: str, path: str) -> Path:
    relative = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
    return Path(mountpoint) / ("" if relative == "." else relative)


def oom_kills(counter: Path | None) -> int | None:
    if counter is None:
        return None
    try:
        for line in counter.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def kernel_log_mentions(pid: int, kmsg: str = "/dev/kmsg") -> str:
    """The kernel's OOM-kill line for ``pid``, or "" (no access, or no such line)."""
    pattern = re.compile(rf"(Killed process {pid} \(|[,:]pid={pid},)")
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    found = ""
    try:
        for _ in range(_MAX_KMSG_RECORDS):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break  # read everything
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # that record was overwritten while we read
                break
            if not record:
                break
            text = record.decode(errors="replace")
            if pattern.search(text) and "ill" in text:
                found = text.partition(";")[2].strip()
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return found


class OomProbe:
    """Started when a round starts; ``evidence(pid)`` when a worker died by SIGKILL."""

    def __init__(self, counter: Path | None = None, kmsg: str = "/dev/kmsg") -> None:
        self._counter = counter if counter is not None else memory_cgroup_counter()
        self._kmsg = kmsg
        self._before = oom_kills(self._counter)

    def evidence(self, pid: int) -> str:
        parts = []
        now = oom_kills(self._counter)
        if self._before is not None and now is not None and now > self._before:
            parts.append(f"cgroup {self._counter}: oom_kill {self._before} -> {now}")
        line = kernel_log_mentions(pid, self._kmsg)
        if line:
            parts.append(f"kernel: {line}")
        return "; ".join(parts)
