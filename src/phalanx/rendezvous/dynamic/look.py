"""A look at the ring now, not at the next heartbeat interval (``liveness``'s thread).

A rank of this node that fails with a peer's error (``report.classify.peer_error``:
"Connection closed by peer") saw a peer's rank go. When that peer's agent died, its guardian
has most often said so in the store already (``lastword``: some 10 ms after the death; the
rank's error reaches this node's agent some 50 ms after it), but the ring watch judged the
next node only once per ``heartbeat_interval``: the word waited up to that long to be read
(a 0.5 s detect at the soak's pace on etcd, issue 41). So ``JoinedRound.report_failure``
asks for a look before it posts the node's own failure, and waits for it (bounded): the
watcher of the dead node posts the loss first, the store's order of failures puts the
cause ahead of its consequences, and the others' wait for a cause (``Endings.
round_records``) ends at its first read. For one heartbeat interval after, every pass of the
thread (a quarter interval apart) judges the ring, in case the word comes after the error.

On a store where the thread parks in a wait for the next event until its heartbeat duties
(the agent store: ``Liveness._wait_for_event``) a look cannot wake it: there it is only
asked for, and nobody waits for it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Look:
    """The thread's passes as seen by others: looks asked for, pauses cut short by them."""

    def __init__(self, interval: float, clock: Callable[[], float], wakes: bool) -> None:
        """``interval``: how long after a look every pass still judges the ring; ``wakes``:
        whether ``pause`` is the thread's only wait (else ``now`` does not wait)."""
        self._interval = interval
        self._wakes = wakes
        self._clock = clock
        self._cond = threading.Condition()
        self._begun = self._ended = 0  # passes of the thread
        self._until = -math.inf  # every pass judges the ring until then (``clock``)
        self._woken = False
        self._running = False

    def now(self, bound: float) -> None:
        """Have the thread judge the ring at once, and on every pass for ``interval``;
        return once a pass begun after this call has ended, at most ``bound`` seconds later
        (at once when the thread does not run, or a look cannot wake it)."""
        with self._cond:
            self._until = self._clock() + self._interval
            if not (self._running and self._wakes):
                return
            target = self._begun + 1
            self._woken = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._ended >= target or not self._running, bound)

    def due(self, now: float) -> bool:
        """Whether a pass at ``now`` judges the ring for a look."""
        with self._cond:
            return now < self._until

    def pause(self, seconds: float) -> None:
        """The thread's pause between passes, cut short by a look or ``wake``."""
        with self._cond:
            self._cond.wait_for(lambda: self._woken, seconds)
            self._woken = False

    def wake(self) -> None:
        """End the pause now (the thread is stopping)."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    @contextmanager
    def running(self) -> Iterator[None]:
        """Around the thread's loop: a look waits for passes only while it runs."""
        with self._cond:
            self._running = True
        try:
            yield
        finally:
            with self._cond:
                self._running = False
                self._cond.notify_all()

    @contextmanager
    def passing(self) -> Iterator[None]:
        """Around one pass of the thread."""
        with self._cond:
            self._begun += 1
        try:
            yield
        finally:
            with self._cond:
                self._ended += 1
                self._cond.notify_all()
