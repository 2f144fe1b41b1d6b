"""Forking a round's workers from one request, in the per-run template and in the warm service.

The agent sends its workers' fork requests in one message (``{"forks": [...]}``, see
``phalanx.worker.protocol``); they are forked back to back and one answer goes back with
every pid and pidfd, so a launch of N workers waits for one round trip, not N (each was a
fork plus the scheduling of two processes on a loaded machine: 11-15 ms here).

Each child keeps only its own two stdio fds: its siblings' pipe ends and the pidfds of the
siblings forked before it are closed before it becomes its worker, so no worker holds
another's output open (the agent would not see that one's output end) or can watch it.
When a fork fails (a process limit), the requests before it are forked and answered, the
failed one is named by its place (the first not in ``pids``), and the rest are not tried.

Imported by the template before torch: stdlib only.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from phalanx.worker.protocol import BATCH, ForkRequest, ProtocolError

# A scheduler signals every process of a job (Slurm's scancel --signal, a pod's SIGTERM):
# the template ignores these (it is the agent's to stop: SIGKILL, or its death signal), and
# blocks them around each fork, so that one sent to a new worker before it has its own
# dispositions back stays pending until it has them (``become``), instead of being ignored.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                signal.SIGUSR2)  # fmt: skip


@dataclass
class Forked:
    """What forking a batch gave: in a child, ``child`` (its request and its stdio fds); in
    the server, ``children`` (pid, pidfd) in the requests' order and, when a request could
    not be forked, ``error``: why the one after them was not."""

    child: tuple[ForkRequest, tuple[int, int]] | None = None
    children: list[tuple[int, int]] = field(default_factory=list)
    error: dict[str, Any] | None = None

    def answer(self) -> tuple[dict[str, Any], tuple[int, ...]]:
        """The reply to the agent and the fds that go with it (one pidfd per pid)."""
        pids = [pid for pid, _ in self.children]
        return {"pids": pids, **(self.error or {})}, tuple(fd for _, fd in self.children)


def fork_blocked(mask: set[int]) -> int:
    """``os.fork()`` with the stop signals blocked in the child (``mask`` back in the parent).

    Blocked, not ignored: a stop signal sent to the child before ``become`` has restored its
    dispositions (the agent's, the moment it has the pid) is kept pending and delivered when
    ``become`` unblocks it."""
    # What the gc docs advise for fork servers: the worker's collections then never scan
    # (and so never copy) the inherited heap, and ``leave`` can tell the worker's own
    # objects from the template's.
    gc.freeze()
    pid = -1
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        pid = os.fork()
    finally:
        if pid != 0:  # the template (or a failed fork): its own mask back
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return pid


def requests(message: dict[str, Any], fds: list[int]) -> list[ForkRequest]:
    """The fork requests of ``message``, checked against the fds that came with it."""
    listed = message.get("forks")
    if not isinstance(listed, list) or not 0 < len(listed) <= BATCH or len(fds) != 2 * len(listed):
        got = len(listed) if isinstance(listed, list) else sorted(message)
        raise ProtocolError(
            f"expected 1 to {BATCH} fork requests with 2 fds each, got {got} and {len(fds)} fds"
        )
    return [ForkRequest.from_json(each) for each in listed]


def fork_batch(message: dict[str, Any], fds: list[int], mask: set[int]) -> Forked:
    """Fork one child per request of ``message`` (``mask``: the server's signal mask). In the
    server every fd of ``fds`` is closed when this returns; in a child all but its own."""
    try:
        batch = requests(message, fds)
    except (ProtocolError, KeyError, TypeError, AttributeError, ValueError) as exc:
        _close(fds)
        return Forked(error=_error(exc))
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # or a child would print what the server had buffered
    forked = Forked()
    for number, request in enumerate(batch):
        try:
            pid = fork_blocked(mask)
        except OSError as exc:
            forked.error = _error(exc)
            break
        if pid == 0:
            mine = (fds[2 * number], fds[2 * number + 1])
            _close([fd for fd in fds if fd not in mine] + [fd for _, fd in forked.children])
            return Forked(child=(request, mine))
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # also here, so the group exists before the agent hears the pid
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:  # a descriptor limit: a child nobody can watch must not run
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            forked.error = _error(exc)
            break
        forked.children.append((pid, pidfd))
    _close(fds)
    return forked


def _error(exc: BaseException) -> dict[str, Any]:
    code = exc.errno if isinstance(exc, OSError) else None  # a limit is named by the agent
    return {"error": f"{type(exc).__name__}: {exc}", "errno": code}


def _close(fds: Iterable[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
