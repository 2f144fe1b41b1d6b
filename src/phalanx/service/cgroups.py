"""A process's cgroup in every hierarchy (v2 and each v1 one), and moving into one.

A worker forked by the warm service starts in the service's cgroups; before it runs any of
the job it moves itself into its agent's, in every hierarchy where they differ, so that the
job's limits and a scheduler's kill (Slurm's job cgroup, a container's, phalanx's own job
cgroup) reach it as they reach a cold worker. Stdlib only: it runs in the forked worker.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

# What phalanx names a run's own cgroup (``phalanx.supervisor.cgroup.RUN_CGROUP``, which this
# layer cannot import): a service born in one leaves it for its parent, or the run's end
# would kill it.
RUN_CGROUP = re.compile(r"phalanx-.+_[0-9a-f]{8}")


def _mounts() -> dict[str, tuple[str, str]]:
    """Hierarchy name ("" for v2, else its sorted controllers or ``name=``) -> (root, mount)."""
    found: dict[str, tuple[str, str]] = {}
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as info:
        for line in info:
            fields = line.split()
            dash = fields.index("-")
            kind, options = fields[dash + 1], fields[-1].split(",")
            if kind == "cgroup2":
                found.setdefault("", (fields[3], fields[4]))
            elif kind == "cgroup":
                names = sorted(o for o in options if o not in _MOUNT_OPTIONS)
                found.setdefault(",".join(names), (fields[3], fields[4]))
    return found


_MOUNT_OPTIONS = frozenset({"rw", "ro", "nosuid", "nodev", "noexec", "relatime", "clone_children",
                            "xattr", "noprefix", "cpuset_v2_mode", "favordynmods"})  # fmt: skip


def cgroup_dirs(pid: int | str = "self") -> dict[str, str]:
    """The directory of ``pid``'s cgroup in each mounted hierarchy (by hierarchy name)."""
    mounts = _mounts()
    dirs: dict[str, str] = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cgroup") as own:
        for line in own:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            name = "" if number == "0" else ",".join(sorted(controllers.split(",")))
            if name not in mounts:
                continue
            root, mount = mounts[name]
            relative = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
            if relative.startswith(".."):
                continue  # outside what this mount shows (another namespace's view)
            dirs[name] = os.path.normpath(os.path.join(mount, relative))
    return dirs


def unreachable(target: dict[str, str]) -> list[str]:
    """The cgroups of ``target`` this process could not move itself into."""
    own = cgroup_dirs()
    return [
        path
        for name, path in target.items()
        if own.get(name, path) != path
        and not os.access(os.path.join(path, "cgroup.procs"), os.W_OK)
    ]


def move_into(target: dict[str, str]) -> None:
    """Move this process into ``target``'s cgroups where its own differ (``OSError`` if not)."""
    own = cgroup_dirs()
    for name, path in target.items():
        if own.get(name, path) != path:
            Path(path, "cgroup.procs").write_text(f"{os.getpid()}\n")


def leave_run_cgroup() -> None:
    """In each hierarchy where this process is in a run's own cgroup, move to its parent."""
    for path in cgroup_dirs().values():
        if RUN_CGROUP.fullmatch(os.path.basename(path)):
            with contextlib.suppress(OSError):
                Path(os.path.dirname(path), "cgroup.procs").write_text(f"{os.getpid()}\n")
