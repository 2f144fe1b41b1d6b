"""Fencing: a node cut off from the store SIGKILLs its workers before the others can re-form.

The survivors cannot count a node lost sooner than ``wait`` after the start of the node's
last store write that proved it alive: with heartbeat counters (c10d, static) a watcher
needs the counter unchanged for ``heartbeat_timeout``, timed from after the read that first
showed it; with leases (etcd) the key lives ``lease_ttl`` past the last renewal etcd took,
and etcd took it after the renewal was sent. The node times the same thing on its own
monotonic clock and fences at ``fence_after``::

    fence_after + KILL_BOUND + MARGIN <= wait
    fence_after = wait - KILL_BOUND - MARGIN    (defaults: 10 - 1 - 1 = 8 s)

so its workers are SIGKILLed and reaped at least ``MARGIN`` before any survivor can declare
it lost, and a new round (and new workers of the same ranks) can only start after that.

The deadline is kept by a thread of its own that does no I/O (``Fence``): a store call
blocked in the network delays the next proof, never the fence. A node that is no member
yet (a fresh node, a spare) stands its fence down while it waits and arms it when it
arrives in a round (``arrived``): nobody counts it lost before then, and a spare paused
longer than ``fence_after`` while it waited would otherwise fence itself once chosen.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("phalanx")

# Seconds from the fence's SIGKILL until every worker is reaped, as the supervisor waits for
# it (a SIGKILLed process ends within milliseconds unless it is stuck in the kernel; one that
# outlives this is named as breaking the fence).
KILL_BOUND = 1.0
# Seconds kept in hand for what the inequality does not model: the fence thread waking late
# on a loaded machine, the hosts' clocks running at slightly different rates.
MARGIN = 1.0


@dataclass(frozen=True)
class FenceTiming:
    """``wait``: the survivors' wait (``heartbeat_timeout``, or the lease's TTL), counted
    from the start of a write that proved this node alive; ``beat``: how often such a write
    is made; ``source``: how ``wait`` is set, for messages."""

    wait: float
    beat: float
    source: str

    @property
    def fence_after(self) -> float:
        return self.wait - KILL_BOUND - MARGIN


def counters_timing(heartbeat_interval: float, heartbeat_timeout: float) -> FenceTiming:
    """Heartbeat counters (c10d, static): a write every heartbeat interval."""
    return FenceTiming(heartbeat_timeout, heartbeat_interval, "heartbeat_timeout")


def lease_seconds(lease_ttl: float) -> int:
    """The TTL phalanx asks etcd for (whole seconds; etcd may only raise it)."""
    return max(1, round(lease_ttl))


def lease_timing(lease_ttl: float) -> FenceTiming:
    """Leases (etcd): renewed three times per ``fence_after`` (more often than etcd's own
    TTL/3), so one slow renewal costs neither the lease nor the workers."""
    ttl = lease_seconds(lease_ttl)
    fence_after = ttl - KILL_BOUND - MARGIN
    beat = fence_after / 3 if fence_after > 0 else ttl / 3
    return FenceTiming(float(ttl), beat, "lease_ttl")


def timing_problem(timing: FenceTiming) -> str | None:
    """Why a node could not fence in time with ``timing`` (one line), or None.

    ``fence_after`` must leave room for a missed write: at least two beats."""
    if timing.fence_after >= 2 * timing.beat:
        return None
    if timing.source == "lease_ttl":  # renewals follow fence_after: any room at all does
        least, beats = math.floor(KILL_BOUND + MARGIN) + 1.0, "a lease renewal"
    else:
        least, beats = KILL_BOUND + MARGIN + 2 * timing.beat, "two heartbeat intervals"
    return (
        f"--rdzv-conf {timing.source}={timing.wait:g}: too short to fence a node cut off from "
        f"the store (fence_after = {timing.source} - {KILL_BOUND:g} s to kill its workers - "
        f"{MARGIN:g} s margin = {timing.fence_after:g} s must cover {beats}); "
        f"give {timing.source} >= {least:g}"
    )


class Fence:
    """Kills the guarded process groups once no proof came for ``timing.fence_after``.

    Proofs (``proved_alive``) come from the thread that made the write; ``guard`` and
    ``release`` from the supervisor. Firing is final. Until the first proof nothing is
    armed (no peer can count a node lost that never joined).
    """

    def __init__(self, timing: FenceTiming, clock: Callable[[], float] = time.monotonic) -> None:
        self.timing = timing
        self._clock = clock
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._groups: set[int] = set()
        self._reason: str | None = None
        self._fired_at: float | None = None
        self._standing_down = False
        # Proofs from writes that began before this are stale (``arrived``, ``rearm``).
        self._armed_at: float | None = None
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the writers' side -----------------------------------------------------------------
    def proved_alive(self, start: float) -> None:
        """A write that started at ``start`` (this clock) succeeded just now. A proof that
        arrives after the deadline has passed does not count: by then the fence is due."""
        with self._lock:
            if self._reason is not None or self._standing_down:
                return
            if self._armed_at is not None and start < self._armed_at:
                return  # began before the fence was armed afresh: proves nothing now
            now = self._clock()
            if self._deadline is not None and now >= self._deadline:
                killed = self._fire_locked(now)
                fired = True
            else:
                fired = False
                due = start + self.timing.fence_after
                self._deadline = due if self._deadline is None else max(self._deadline, due)
                self._start_thread_locked()
        if fired:
            self._say(killed)
        self._changed.set()

    def stand_down(self) -> None:
        """This node left on purpose (its workers are done): proofs stop, so must the fence."""
        with self._lock:
            self._standing_down = True
        self._changed.set()

    def rearm(self) -> None:
        """For a node that fenced itself and then rejoined as a new member: no reason, no
        deadline, no guarded group, until its new heartbeats prove it alive again (the
        supervisor keeps this object, so the next round's workers are guarded by it). A
        write that began before now proves nothing for the new member."""
        self._reset()
        with self._lock:
            self._standing_down = False
            self._armed_at = self._clock()

    def arrived(self) -> None:
        """A node that is no member yet (a fresh node, a spare) arrives in a round, its fence
        stood down while it waited: no member can count it lost from before now (they judge
        it once the round has closed, after this), so a pause while it waited does not
        count. Armed afresh, as if a write had proved it alive now -- in one locked step: a
        proof whose write began before a pause, delivered by the beat thread in between,
        would otherwise set a deadline already past and fire the fence at once."""
        self._reset()
        with self._lock:
            now = self._clock()
            self._standing_down = False
            self._armed_at = now
            self._deadline = now + self.timing.fence_after
            self._start_thread_locked()
        self._changed.set()

    @property
    def armed(self) -> bool:
        """The fence has a deadline and would fire when it passes (not stood down)."""
        with self._lock:
            return self._deadline is not None and not self._standing_down

    def _reset(self) -> None:
        """No reason, no deadline, no guarded group, no thread; left standing down."""
        thread = self._thread
        with self._lock:
            self._reason = self._fired_at = self._deadline = None
            self._groups.clear()
            self._standing_down = True  # the old thread, if still waiting, returns
        self._changed.set()
        if thread is not None:
            thread.join(timeout=1.0)
        with self._lock:
            self._thread = None

    def _start_thread_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="phalanx-fence", daemon=True)
            self._thread.start()

    # -- the supervisor's side -------------------------------------------------------------
    def guard(self, pgid: int) -> None:
        """Kill process group ``pgid`` when the fence fires (at once if it has)."""
        with self._lock:
            self._groups.add(pgid)
            fired = self._reason is not None
        if fired:
            _kill(pgid)

    def release(self, pgid: int) -> None:
        with self._lock:
            self._groups.discard(pgid)

    @property
    def reason(self) -> str | None:
        """Why the node fenced (one line), or None while it has not."""
        with self._lock:
            return self._reason

    def due(self) -> str | None:
        """``reason``, the fence fired here first if its deadline has passed, for a reader
        that must not depend on the fence's thread having run: after the whole agent was paused
        (SIGSTOP, a frozen VM) every thread wakes at once, and the supervisor, reading an
        exit that came meanwhile, may run first: by the clock that exit is phalanx's."""
        with self._lock:
            now, deadline = self._clock(), self._deadline
            fire = (
                self._reason is None
                and not self._standing_down
                and deadline is not None
                and now >= deadline
            )
            killed = self._fire_locked(now) if fire else 0
            reason = self._reason
        if fire:
            self._say(killed)
            self._changed.set()  # its thread returns
        return reason

    @property
    def fired_at(self) -> float | None:
        with self._lock:
            return self._fired_at

    # -- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                if self._reason is not None or self._standing_down:
                    return
                assert self._deadline is not None
                now = self._clock()
                left = self._deadline - now
                if left <= 0:
                    killed = self._fire_locked(now)
                    break
                self._changed.clear()
            self._changed.wait(left)
        self._say(killed)

    def _say(self, killed: int) -> None:
        log.error("rendezvous: %s (%d worker group(s) killed)", self._reason, killed)

    def _fire_locked(self, now: float) -> int:
        """SIGKILL every guarded group (syscalls only, under the lock so ``guard`` cannot
        slip a group in between); returns how many."""
        self._reason = (
            f"fenced: no store write confirmed this node alive for {self.timing.fence_after:g} s "
            f"({self.timing.source} {self.timing.wait:g} s - {KILL_BOUND:g} s to kill - "
            f"{MARGIN:g} s margin): its workers were SIGKILLed before the others could count "
            "it lost"
        )
        self._fired_at = now
        for pgid in self._groups:
            _kill(pgid)
        return len(self._groups)


def _kill(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
