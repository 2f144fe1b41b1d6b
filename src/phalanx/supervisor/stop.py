"""Stopping a round's workers (``supervisor.group``): the stop signal to every worker's
process group, a wait to a deadline, SIGKILL, a bounded wait; and after the node's fence
fired, the reaping of the workers its SIGKILLs ended."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable

from phalanx.rendezvous.fencing import KILL_BOUND, Fence
from phalanx.supervisor.laststep import LAST_STEP_GRACE, ask_last_step
from phalanx.supervisor.logs import LogStream
from phalanx.supervisor.pipes import PipeSelector
from phalanx.supervisor.preempt import tell_stopping
from phalanx.supervisor.reap import KILL_WAIT, Reaper, drain
from phalanx.supervisor.slot import Slot, killpg, with_logs

log = logging.getLogger("phalanx")


class Stopper:
    def __init__(
        self,
        reaper: Reaper,
        fence: Fence | None,
        shutdown_timeout: float,
        wall_clock: Callable[[], float],
    ) -> None:
        self._reaper = reaper
        self._fence = fence
        self._shutdown_timeout = shutdown_timeout
        self._wall_clock = wall_clock
        # Wall clock when the round's stop began (``Supervisor.stop_began``); 0.0: none yet.
        self.began = 0.0

    def stop(
        self,
        slots: list[Slot],
        streams: dict[int, LogStream],
        selector: PipeSelector,
        first_signal: int,
        grace: float | None = None,
        last_step: bool = False,
    ) -> None:
        """Signal every group, wait to the deadline (``grace``; default the shutdown
        timeout), then SIGKILL and wait a bounded time. With ``last_step`` (a stop after a
        failure) and a SIGTERM first, the ranks holding a last step are asked to write it
        first (``supervisor.laststep``), for at most ``LAST_STEP_GRACE`` seconds.

        A worker whose exit is already pending (its exit fd readable: it died before this
        signal, e.g. while the agent was busy polling or not scheduled) is recorded first, as
        its own exit, not as one phalanx caused -- unless the fence has fired: its SIGKILLs
        are phalanx's."""
        if not self.began:
            self.began = self._wall_clock()
        fenced = self._fence is not None and self._fence.reason is not None
        self._reaper.handle_events(selector.select(0), slots, streams, selector, stopping=fenced)
        if grace is None:
            grace = KILL_WAIT if first_signal == signal.SIGKILL else self._shutdown_timeout
        if last_step and first_signal == signal.SIGTERM and not fenced:
            self._ask_last_step(slots, streams, selector)
        if first_signal == signal.SIGTERM:
            tell_stopping(s.plan for s in slots if s.exit is None)
        for sig, wait in ((first_signal, grace), (signal.SIGKILL, KILL_WAIT)):
            # Groups of exited workers too: their children may still be running.
            for slot in slots:
                if sig == first_signal and not fenced:
                    # Looked at again just before its signal: all ranks that raise at once
                    # end within the moment the lines above take, each with its own error.
                    self._reaper.reap_if_exited(slot, selector)
                killpg(slot.proc.pid, sig)
            deadline = time.monotonic() + wait
            while any(s.exit is None for s in slots) and time.monotonic() < deadline:
                events = selector.select(max(0.0, deadline - time.monotonic()))
                self._reaper.handle_events(events, slots, streams, selector, stopping=True)
            if sig == signal.SIGKILL or all(s.exit is not None for s in slots):
                if sig != signal.SIGKILL:
                    for slot in slots:
                        killpg(slot.proc.pid, signal.SIGKILL)
                break
        for slot in slots:
            if slot.exit is None:  # SIGKILLed and still there: stuck in the kernel
                slot.exit = self._reaper.stuck(slot)
        drain(streams, selector)
        for slot in slots:
            if slot.exit is not None:
                slot.exit = with_logs(slot.exit, slot)

    def _ask_last_step(
        self, slots: list[Slot], streams: dict[int, LogStream], selector: PipeSelector
    ) -> None:
        def wait_events(timeout: float) -> None:
            events = selector.select(timeout)
            # Part of phalanx's stop: an exit now is one the failure being stopped caused.
            self._reaper.handle_events(events, slots, streams, selector, stopping=True)

        ask_last_step(slots, min(LAST_STEP_GRACE, self._shutdown_timeout), wait_events)

    def reap_fenced(
        self,
        slots: list[Slot],
        streams: dict[int, LogStream],
        selector: PipeSelector,
    ) -> None:
        """The fence SIGKILLed the workers: reap them. One still there ``KILL_BOUND`` after
        the kill breaks the fencing argument (the others may start its rank again while it
        exists) and is named; then the usual SIGKILL and bounded wait."""
        assert self._fence is not None
        deadline = (self._fence.fired_at or time.monotonic()) + KILL_BOUND
        while any(s.exit is None for s in slots) and time.monotonic() < deadline:
            events = selector.select(max(0.0, deadline - time.monotonic()))
            self._reaper.handle_events(events, slots, streams, selector, stopping=True)
        for slot in slots:
            if slot.exit is None:
                log.error(
                    "%s (pid %d) was not reaped %g s after the fence's SIGKILL: the other "
                    "nodes may start rank %d again while it still exists",
                    slot.plan.name, slot.proc.pid, KILL_BOUND, slot.plan.global_rank,
                )  # fmt: skip
        self.stop(slots, streams, selector, signal.SIGKILL)
