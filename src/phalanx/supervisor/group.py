"""Running one round of local workers: start, watch, stop -- all driven by events.

Worker exits arrive as readable pidfds and log output as readable pipes, in one ``select``
loop; the only timers are the tick (the rendezvous poll) and the caller's ``due`` moment.
Shutdown order is fixed: the stop signal to every worker's process group, wait to a
``time.monotonic()`` deadline, SIGKILL, bounded wait.
A lost store skips the grace: SIGKILL at once. Every worker group is guarded by the node's
fence too (``phalanx.rendezvous.fencing``), whose own thread SIGKILLs them when the node may
have been cut off from the store for too long; the loop then reports ``STORE_LOST``.

A worker's slot, the reaping of exits and the workers' stop are their own modules (``slot``,
``reap``, ``stop``). What the caller checks each tick (``on_tick``) is one callable: the
agent's is ``phalanx.tick.Watchers``.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import BinaryIO

from phalanx.errors import signal_name
from phalanx.plan import RoundPlan, WorkerPlan
from phalanx.rendezvous.api import EventKind, JobEvent
from phalanx.rendezvous.fencing import Fence
from phalanx.resources.limits import start_failed
from phalanx.supervisor.console import Console, OnLost
from phalanx.supervisor.counters import Counters
from phalanx.supervisor.exits import WorkerExit
from phalanx.supervisor.guardian import Guardian
from phalanx.supervisor.logs import LogStream, finish_all
from phalanx.supervisor.pipes import PipeSelector
from phalanx.supervisor.preempt import Preemption, PreemptWatch, kill_margin
from phalanx.supervisor.process import exec_worker
from phalanx.supervisor.reap import Reaper, drain
from phalanx.supervisor.signals import SignalWatcher
from phalanx.supervisor.slot import (
    Slot,
    make_log_dir,
    running_workers,
    wire_logs,
)
from phalanx.supervisor.start import Launch, LaunchAll, one_by_one
from phalanx.supervisor.stop import Stopper

log = logging.getLogger("phalanx")
_FIRST_TICK = 0.1  # seconds to the first tick of a round (then doubling to its interval)


class Outcome(Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REMOTE = "remote"  # an event from another node (peer failure, node lost, scale-up)
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"  # the caller's on_tick asked to stop the round (e.g. a hang)
    PREEMPTED = "preempted"  # every worker ended (or was stopped by the deadline) after one


@dataclass(frozen=True)
class RoundResult:
    outcome: Outcome
    exits: tuple[WorkerExit, ...]
    event: JobEvent | None = None
    signum: int | None = None
    # Set when the round was preempted, whatever its outcome (a failure during the grace
    # is still a failure, but no restart follows it).
    preemption: Preemption | None = None


# Called every monitor tick with (plan, pid) of every live worker; True stops the round.
OnTick = Callable[[Sequence[tuple[WorkerPlan, int]]], bool]
# When the caller's checks must run next, whatever the tick's pace (monotonic; None: none).
Due = Callable[[], float | None]


class Supervisor:
    def __init__(
        self,
        guardian: Guardian,
        *,
        shutdown_timeout: float,
        monitor_interval: float,
        launch: Launch = exec_worker,
        launch_all: LaunchAll | None = None,
        console: tuple[BinaryIO, BinaryIO] | None = None,
        on_console_lost: OnLost = lambda names, why: None,
        duplicate_filters: tuple[tuple[bytes, ...], tuple[bytes, ...]] = ((), ()),
        host: str | None = None,
        wall_clock: Callable[[], float] = time.time,
        fence: Fence | None = None,
    ) -> None:
        """``wall_clock``: the time stamped on each exit, for display (``supervisor.clock``).
        ``fence``: guards every worker group (``phalanx.rendezvous.fencing``).
        ``on_console_lost``: told once when the console goes away (``supervisor.console``).
        ``launch_all``: starts a round's workers (a warm template's); else ``launch``, one by
        one."""
        self._guardian = guardian
        self._fence = fence
        self._monitor_interval = monitor_interval
        self._launch_all = launch_all if launch_all is not None else one_by_one(launch)
        self._console = Console(console, on_console_lost) if console is not None else None
        self._duplicate_filters = duplicate_filters
        self._host = host or socket.gethostname()
        self._preempt: PreemptWatch | None = None  # the running round's
        self._reaper = Reaper(self._host, wall_clock, lambda: self._preempt)
        self._stopper = Stopper(self._reaper, fence, shutdown_timeout, wall_clock)
        self._selector: PipeSelector | None = None  # the running round's
        self._counters = Counters()  # every worker's progress counters, held across rounds

    @property
    def stop_began(self) -> float:
        """Wall clock when the last round's stop began (its failure was acted on): for the
        event log's recovery figures; 0.0 when the round ended without a stop."""
        return self._stopper.began

    def close(self) -> None:
        """After the last round: let go of the workers' progress counters."""
        self._counters.close()

    def wake(self) -> None:
        """Tick now (``on_tick``, then ``poll``) rather than at the next tick: the
        rendezvous has an event (called from its thread; between rounds, nothing)."""
        selector = self._selector
        if selector is not None:
            with contextlib.suppress(OSError):  # closed as the round ended
                selector.ring()

    def run(
        self,
        plan: RoundPlan,
        signals: SignalWatcher,
        poll: Callable[[], JobEvent | None] = lambda: None,
        on_tick: OnTick = lambda running: False,
        preempt: PreemptWatch | None = None,
        tick_every: float | None = None,
        due: Due = lambda: None,
    ) -> RoundResult:
        """Run one round to its end. Every ``monitor_interval`` (``tick_every`` when given:
        a caller whose ``poll`` has nothing to deliver ticks only as often as its own checks
        need) and at once after a signal: ``on_tick`` (the caller's own checks; True stops
        the workers and returns ``STOPPED``), then ``poll``; and at the moment ``due`` says,
        when that comes first (the hang watch's deadlines: a hung rank's round fails at its
        deadline, not up to a tick after it). With ``preempt``, a preemption
        signal here or a peer's ``PREEMPTED`` lets the workers run on until they end or the
        job's deadline (``phalanx.supervisor.preempt``)."""
        every = self._monitor_interval if tick_every is None else tick_every
        selector = self._selector = PipeSelector()
        selector.register(signals.fd, selectors.EVENT_READ, None)
        self._stopper.began = 0.0
        slots: list[Slot] = []
        streams: dict[int, LogStream] = {}
        self._preempt = preempt
        try:
            self._start_all(plan, selector, streams, slots)
            # The first ticks come quickly (0.1 s, then doubling up to ``every``): the workers'
            # start and first progress are recorded as they happen, then a quiet job ticks
            # as seldom as ``every`` allows.
            ramp = _FIRST_TICK
            next_poll = time.monotonic() + min(every, ramp)
            while True:
                next_poll, fenced = self._wait(selector, signals, slots, streams, next_poll, due)
                ended = self._settle(slots, streams, selector, signals, fenced)
                if ended is None and time.monotonic() >= next_poll:
                    ramp *= 2
                    next_poll = time.monotonic() + min(every, ramp)
                    ended = self._tick(slots, streams, selector, poll, on_tick)
                if ended is not None:
                    return ended
        finally:
            self._end_round(slots, streams, selector)

    def _wait(
        self,
        selector: PipeSelector,
        signals: SignalWatcher,
        slots: list[Slot],
        streams: dict[int, LogStream],
        next_poll: float,
        due: Due,
    ) -> tuple[float, str | None]:
        """Wait for what comes first, an event, the tick at ``next_poll`` or the ``due``
        moment, and record the exits that came. Returns when the next tick is due (0.0: at
        once, after a signal, the rendezvous' ring or the due moment) and the fence's reason
        if it fired."""
        moment = due()
        until = next_poll if moment is None else min(next_poll, moment)
        timeout = max(0.0, until - time.monotonic())
        bound = self._preempt.wait_bound() if self._preempt is not None else None
        events = selector.select(timeout if bound is None else min(timeout, bound))
        # Read before the exits: the fence's SIGKILLs are phalanx's, not failures (``due``:
        # nor an exit that came while a paused agent's fence fell due).
        fenced = self._fence.due() if self._fence is not None else None
        self._reaper.handle_events(events, slots, streams, selector, bool(fenced))
        if any(key.fd == signals.fd for key, _ in events):
            signals.drain()  # or select would return at once forever
            next_poll = 0.0  # a stacks request is answered now, not at the next tick
        if selector.rang() or (moment is not None and time.monotonic() >= moment):
            next_poll = 0.0
        return next_poll, fenced

    def _end_round(
        self, slots: list[Slot], streams: dict[int, LogStream], selector: PipeSelector
    ) -> None:
        """Whatever ended the round (even an exception in our own code): nothing survives."""
        self._reaper.kill_all(slots)
        drain(streams, selector)
        for slot in slots:
            slot.proc.close()
            self._guardian.forget(slot.proc.pid)
            if self._fence is not None:
                self._fence.release(slot.proc.pid)
        self._selector = None
        selector.close()
        finish_all(handle for slot in slots for handle in slot.files)
        self._preempt = None

    def _settle(
        self,
        slots: list[Slot],
        streams: dict[int, LogStream],
        selector: PipeSelector,
        signals: SignalWatcher,
        fenced: str | None,
    ) -> RoundResult | None:
        """After each wake-up: the round's result, if what happened ends it."""
        preempt = self._preempt
        signum = signals.pending()
        if signum is not None:
            self._stopper.stop(slots, streams, selector, signum)
            return self._result(Outcome.INTERRUPTED, slots, signum=signum)
        if fenced is not None:
            self._stopper.reap_fenced(slots, streams, selector)
            lost = JobEvent(EventKind.STORE_LOST, detail=fenced)
            return self._result(Outcome.REMOTE, slots, event=lost)
        taken = signals.take_preempt()
        if (
            taken is not None
            and preempt is not None
            and not preempt.begin(taken, running_workers(slots))
        ):
            log.warning("%s again during the grace: stopping the workers now", signal_name(taken))
            return self._preempt_stop(slots, streams, selector)
        if any(s.exit is not None and s.exit.failed for s in slots):
            self._stopper.stop(slots, streams, selector, signal.SIGTERM, last_step=True)
            return self._result(Outcome.FAILED, slots)
        if all(s.exit is not None for s in slots):
            self._stopper.stop(slots, streams, selector, signal.SIGKILL)  # leftover children only
            preempted = preempt is not None and preempt.preemption is not None
            return self._result(Outcome.PREEMPTED if preempted else Outcome.SUCCEEDED, slots)
        if preempt is not None and preempt.due():
            left = sum(1 for s in slots if s.exit is None)
            log.warning(
                "preemption: the deadline is near; stopping %d worker(s) still running", left
            )
            return self._preempt_stop(slots, streams, selector)
        return None

    def _preempt_stop(
        self, slots: list[Slot], streams: dict[int, LogStream], selector: PipeSelector
    ) -> RoundResult:
        """End a preempted round now: SIGTERM, half the kill margin, SIGKILL."""
        assert self._preempt is not None and self._preempt.preemption is not None
        margin = kill_margin(self._preempt.preemption.grace)
        self._stopper.stop(slots, streams, selector, signal.SIGTERM, grace=margin / 2)
        return self._result(Outcome.PREEMPTED, slots)

    def _result(
        self,
        outcome: Outcome,
        slots: list[Slot],
        event: JobEvent | None = None,
        signum: int | None = None,
    ) -> RoundResult:
        preemption = self._preempt.preemption if self._preempt is not None else None
        return RoundResult(outcome, self._exits(slots), event, signum, preemption)

    def _tick(
        self,
        slots: list[Slot],
        streams: dict[int, LogStream],
        selector: PipeSelector,
        poll: Callable[[], JobEvent | None],
        on_tick: OnTick,
    ) -> RoundResult | None:
        """The caller's checks, then the rendezvous: the round's result if either ends it."""
        running = running_workers(slots)
        if on_tick(running):
            self._stopper.stop(slots, streams, selector, signal.SIGTERM, last_step=True)
            return self._result(Outcome.STOPPED, slots)
        event = poll()
        if event is None:
            return None
        if event.kind is EventKind.PREEMPTED and self._preempt is not None:
            self._preempt.hear(event, running)  # the workers run on, to the job's deadline
            return None
        # Without the store the others may re-form without this node at any moment: no
        # grace period for workers that may overlap new ones.
        gone = event.kind is EventKind.STORE_LOST
        first = signal.SIGKILL if gone else signal.SIGTERM
        self._stopper.stop(slots, streams, selector, first, last_step=True)
        if any(s.exit is not None and s.exit.failed for s in slots):
            # A worker had died on its own before the event was acted on: its failure is
            # this round's story, as if noticed a moment earlier.
            return self._result(Outcome.FAILED, slots)
        return self._result(Outcome.REMOTE, slots, event=event)

    def _start_all(
        self,
        plan: RoundPlan,
        selector: PipeSelector,
        streams: dict[int, LogStream],
        slots: list[Slot],
    ) -> None:
        """Start the round's workers into ``slots``, all at once (``LaunchAll``: a warm
        template forks them from one request). Every worker started gets its slot, and so is
        stopped with the others, before anything can fail; a limit reached on the way
        (descriptors, processes, threads) then raises ``StartFailed``, which ends the round."""
        # (the last attempt's counters were read: its verdict is taken, its events written)
        self._counters.retire(worker.log_dir for worker in plan.workers)
        for worker in plan.workers:
            make_log_dir(str(worker.log_dir))
            self._counters.make(worker.log_dir)  # in memory, linked from there
        started = self._launch_all(plan.workers)
        slots += [
            Slot(w, p, [])
            for w, p in zip(plan.workers, started, strict=False)
            if not isinstance(p, BaseException)
        ]
        failure = next((p for p in started if isinstance(p, BaseException)), None)
        rank = plan.workers[0].global_rank if plan.workers else 0
        try:
            for slot in slots:
                rank = slot.plan.global_rank
                self._guardian.watch(slot.proc.pid)  # the worker leads its own process group
                if self._fence is not None:
                    self._fence.guard(slot.proc.pid)  # killed at once if the node has fenced
                selector.register(slot.proc.exit_fd, selectors.EVENT_READ, slot)
                wire_logs(slot, plan, selector, streams, self._console, self._duplicate_filters)
            if failure is not None:  # the one that could not start, once the others are wired
                rank = plan.workers[len(slots)].global_rank
                raise failure
        except (OSError, RuntimeError) as exc:
            failed = start_failed(rank, exc)
            if failed is None:
                raise
            raise failed from None

    @staticmethod
    def _exits(slots: list[Slot]) -> tuple[WorkerExit, ...]:
        return tuple(s.exit for s in slots if s.exit is not None)
