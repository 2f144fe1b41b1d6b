"""How a round's workers end (``supervisor.group``): each exit noticed and recorded as a
``WorkerExit``, the last SIGKILL with its bounded wait, a worker the kernel will not let go
named with its state, and the pipes drained after."""

from __future__ import annotations

import contextlib
import logging
import select
import selectors
import signal
import time
from collections.abc import Callable
from dataclasses import replace

from phalanx.supervisor.exits import WorkerExit
from phalanx.supervisor.logs import LogStream
from phalanx.supervisor.pipes import PipeSelector
from phalanx.supervisor.preempt import PreemptWatch
from phalanx.supervisor.slot import Slot, killpg, process_state

log = logging.getLogger("phalanx")
# After SIGKILL a process normally vanishes at once; one stuck in an uninterruptible call
# (a GPU driver call, a dead NFS mount) cannot be reaped, so the wait is bounded.
KILL_WAIT = 5.0
DRAIN_WAIT = 1.0


class Reaper:
    """Records each worker's end as its ``WorkerExit`` (host, wall-clock time, whether the
    launcher caused it) and kills what is left."""

    def __init__(
        self,
        host: str,
        wall_clock: Callable[[], float],
        preempt: Callable[[], PreemptWatch | None],
    ) -> None:
        """``preempt``: the running round's preemption watch, if any (a signal it forwarded
        is the launcher's doing)."""
        self._host = host
        self._wall_clock = wall_clock
        self._preempt = preempt

    def handle_events(
        self,
        events: list[tuple[selectors.SelectorKey, int]],
        slots: list[Slot],
        streams: dict[int, LogStream],
        selector: PipeSelector,
        stopping: bool,
    ) -> None:
        for key, _ in events:
            data = key.data
            if isinstance(data, LogStream):
                if not data.pump():
                    selector.unregister(data.fd)
                    del streams[data.fd]
            elif isinstance(data, Slot):
                selector.unregister(key.fd)
                data.exit = self.record_exit(data, data.proc.reap(), stopping)

    def record_exit(self, slot: Slot, returncode: int, stopping: bool) -> WorkerExit:
        noticed = self._wall_clock()
        return WorkerExit(
            rank=slot.plan.global_rank,
            local_rank=slot.plan.local_rank,
            host=self._host,
            pid=slot.proc.pid,
            returncode=returncode,
            time=noticed,
            stopped_by_launcher=(stopping and returncode != 0) or self.forwarded(returncode),
            log_dir=str(slot.plan.log_dir),
            label=slot.plan.name,
            monotonic=time.monotonic(),  # orders this node's exits (report.exits.causal_order)
        )

    def reap_if_exited(self, slot: Slot, selector: PipeSelector) -> None:
        """Record ``slot``'s exit as its own if it has already ended (its exit fd readable):
        called just before phalanx signals it, so a worker that ended before the signal is
        never counted as stopped by phalanx."""
        if slot.exit is not None:
            return
        ready, _, _ = select.select([slot.proc.exit_fd], [], [], 0)
        if ready:
            selector.unregister(slot.proc.exit_fd)
            slot.exit = self.record_exit(slot, slot.proc.reap(), stopping=False)

    def forwarded(self, returncode: int) -> bool:
        """Whether the worker died of the preemption signal phalanx forwarded to it (its
        default action, in a program without phalanx's boot): the launcher's doing."""
        preempt = self._preempt()
        sent = preempt.forwarded if preempt is not None else None
        return sent is not None and returncode == -sent

    def kill_all(self, slots: list[Slot]) -> None:
        """SIGKILL every group and reap what ends within ``KILL_WAIT``; never wait longer:
        a process stuck in the kernel (D state) cannot be reaped until it leaves it."""
        for slot in slots:
            killpg(slot.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT
        while pending := [s for s in slots if s.exit is None]:
            left = deadline - time.monotonic()
            if left <= 0:
                for slot in pending:
                    slot.exit = self.stuck(slot)
                return
            ready, _, _ = select.select([s.proc.exit_fd for s in pending], [], [], left)
            for slot in pending:
                if slot.proc.exit_fd in ready:
                    with contextlib.suppress(ChildProcessError):
                        slot.exit = self.record_exit(slot, slot.proc.reap(), stopping=True)

    def stuck(self, slot: Slot) -> WorkerExit:
        """A worker that SIGKILL did not end: named in the report with its state."""
        state = process_state(slot.proc.pid)
        log.warning(
            "%s (pid %d) could not be ended: still %s after SIGKILL; it is left to the kernel",
            slot.plan.name, slot.proc.pid, state,
        )  # fmt: skip
        exit_ = self.record_exit(slot, -signal.SIGKILL, stopping=True)
        return replace(exit_, stuck_state=state)


def drain(streams: dict[int, LogStream], selector: PipeSelector) -> None:
    """Copy what is left in the pipes, bounded: a stray grandchild may hold one open.
    What a pipe held when its workers ended is read even while its file is behind."""
    selector.draining()
    deadline = time.monotonic() + DRAIN_WAIT
    while streams and time.monotonic() < deadline:
        for key, _ in selector.select(max(0.0, deadline - time.monotonic())):
            if isinstance(key.data, LogStream) and not key.data.pump():
                selector.unregister(key.fd)
                del streams[key.fd]
