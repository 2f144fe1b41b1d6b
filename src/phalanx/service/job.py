"""What a process inherits from its parent besides the environment and the working directory
(which each fork request carries): read in the agent, checked by the service, applied in each
worker it forks, so that a worker has its own job's, as a cold worker (exec'd by its agent)
would, and never the service's or another job's.

``collect`` reads the agent's: umask, resource limits, cgroups, nice value, CPU affinity, the
signals it ignores and blocks (what survives ``exec``; SIGPIPE and SIGXFSZ are reset for a
cold worker, as ``subprocess`` does). ``refusal`` says why the service cannot give a worker
these (a hard limit or priority above its own without privilege, a cgroup it cannot write);
``apply`` sets them, cgroups first. Stdlib only: ``apply`` runs in the forked worker.
"""

from __future__ import annotations

import os
import resource
import signal
from dataclasses import asdict, dataclass
from typing import Any

from phalanx.service import cgroups

LIMITS = {name: getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")}
RESET_AT_EXEC = frozenset({signal.SIGPIPE, signal.SIGXFSZ})  # subprocess's restore_signals


@dataclass(frozen=True)
class JobSettings:
    umask: int
    limits: dict[str, tuple[int, int]]  # RLIMIT_* name -> (soft, hard)
    cgroups: dict[str, str]  # hierarchy -> directory (``cgroups.cgroup_dirs``)
    nice: int
    affinity: tuple[int, ...]
    ignored: tuple[int, ...]
    blocked: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobSettings:
        return cls(
            umask=int(data["umask"]),
            limits={str(k): (int(v[0]), int(v[1])) for k, v in data["limits"].items()},
            cgroups={str(k): str(v) for k, v in data["cgroups"].items()},
            nice=int(data["nice"]),
            affinity=tuple(int(c) for c in data["affinity"]),
            ignored=tuple(int(s) for s in data["ignored"]),
            blocked=tuple(int(s) for s in data["blocked"]),
        )


def _status_field(name: str) -> str:
    # The calling thread's: the signal mask is per thread, and a cold worker inherits the mask
    # of the thread that starts it.
    with open("/proc/thread-self/status") as status:
        for line in status:
            if line.startswith(f"{name}:"):
                return line.split()[1]
    raise OSError(f"no {name} in /proc/thread-self/status")


def _signal_set(mask: str) -> tuple[int, ...]:
    bits = int(mask, 16)
    return tuple(n for n in range(1, signal.NSIG) if bits >> (n - 1) & 1)


def collect() -> JobSettings:
    """This process's (the agent's), as a worker it execs would inherit them."""
    return JobSettings(
        # Read, not os.umask(): setting it even briefly would race the agent's threads.
        umask=int(_status_field("Umask"), 8),
        limits={name: resource.getrlimit(number) for name, number in LIMITS.items()},
        cgroups=cgroups.cgroup_dirs(),
        nice=os.getpriority(os.PRIO_PROCESS, 0),
        affinity=tuple(sorted(os.sched_getaffinity(0))),
        ignored=tuple(s for s in _signal_set(_status_field("SigIgn")) if s not in RESET_AT_EXEC),
        blocked=_signal_set(_status_field("SigBlk")),
    )


def _above(wanted: int, own: int) -> bool:
    infinity = resource.RLIM_INFINITY
    return own != infinity and (wanted == infinity or wanted > own)


def refusal(job: JobSettings) -> str | None:
    """Why this process cannot give a child ``job``'s settings, or None."""
    privileged = os.geteuid() == 0
    for name, (_, hard) in job.limits.items():
        own_hard = resource.getrlimit(LIMITS[name])[1] if name in LIMITS else hard
        if not privileged and _above(hard, own_hard):
            return f"the job's hard {name} ({hard}) is above the service's ({own_hard})"
    if not privileged and job.nice < os.getpriority(os.PRIO_PROCESS, 0):
        return f"the job's nice value {job.nice} is below the service's"
    unreachable = cgroups.unreachable(job.cgroups)
    if unreachable:
        return f"its workers could not join the job's cgroups {', '.join(unreachable)}"
    return None


def apply(job: JobSettings) -> None:
    """Give this process (a fresh fork) ``job``'s settings; ``OSError`` if one cannot be."""
    cgroups.move_into(job.cgroups)
    for name, value in job.limits.items():
        if name in LIMITS and resource.getrlimit(LIMITS[name]) != value:
            resource.setrlimit(LIMITS[name], value)
    if os.getpriority(os.PRIO_PROCESS, 0) != job.nice:
        os.setpriority(os.PRIO_PROCESS, 0, job.nice)
    os.sched_setaffinity(0, job.affinity)
    os.umask(job.umask)
    valid = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}
    for signum in job.ignored:
        if signum in valid:
            signal.signal(signum, signal.SIG_IGN)
    blocked = [s for s in job.blocked if s in valid]
    if blocked:
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
