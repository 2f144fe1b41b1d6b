"""The per-process resource limits a launch runs into: descriptors (``RLIMIT_NOFILE``) and
processes (``RLIMIT_NPROC``, a cgroup's ``pids.max``).

The agent and the store host raise their soft descriptor limit to the hard one at start
(``raise_descriptor_limit``); what still fails when a worker starts is named in one line
(``StartFailed``) instead of a traceback.
"""

from __future__ import annotations

import errno
import logging
import resource

from phalanx.errors import PhalanxError

log = logging.getLogger("phalanx")

# What fork, pipe, socket and pidfd_open fail with when a limit is reached.
LIMIT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN})


class StartFailed(PhalanxError):
    """A worker of the round could not be started because a limit was reached (exit 1)."""


def raise_descriptor_limit() -> None:
    """Let this process hold as many descriptors as the hard limit allows: a worker takes
    several (its pipes, a pidfd), and a job of a thousand nodes is a thousand connections to
    the store's host, past the usual soft limit of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:  # an infinite hard limit, above fs.nr_open
            log.debug("cannot raise the descriptor limit: %s", exc)


def _limit(which: int) -> str:
    soft, hard = resource.getrlimit(which)
    show = ["unlimited" if v == resource.RLIM_INFINITY else str(v) for v in (soft, hard)]
    return f"soft={show[0]} hard={show[1]}"


def describe_limit(exc: OSError | RuntimeError) -> str | None:
    """The limit ``exc`` says was reached, with its values and how to raise it; None when
    ``exc`` is no limit's error. Python raises ``RuntimeError`` for a thread it cannot start
    (threads count against the same limits as processes)."""
    if isinstance(exc, RuntimeError):
        return _processes() if "can't start new thread" in str(exc) else None
    if exc.errno == errno.EMFILE:
        nofile = _limit(resource.RLIMIT_NOFILE)
        return f"too many open files (RLIMIT_NOFILE {nofile}); raise it with ulimit -n"
    if exc.errno == errno.ENFILE:
        return "the system's table of open files is full (ENFILE); raise sysctl fs.file-max"
    if exc.errno == errno.EAGAIN:
        return _processes()
    return None


def _processes() -> str:
    nproc = _limit(resource.RLIMIT_NPROC)
    return (
        f"cannot create another process or thread (RLIMIT_NPROC {nproc}, or the cgroup's "
        "pids.max); raise it with ulimit -u, or the container's pids limit"
    )


def start_failed(rank: int, exc: OSError | RuntimeError) -> StartFailed | None:
    """The one-line error of rank ``rank`` not started because of ``exc``; None when ``exc``
    is no limit's error (a bug, or a missing program: left as it is)."""
    limit = describe_limit(exc)
    return StartFailed(f"cannot start rank {rank}: {limit}") if limit is not None else None
