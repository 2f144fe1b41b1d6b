"""The background thread of a multi-node handler: heartbeat, ring watch, event reader.

It does every periodic store operation, so ``poll()`` never touches the network:

- it waits on the store for the next entry of the round's event log (the agent store parks
  the wait and wakes it when the entry is written, so it lasts until the thread's next
  heartbeat duties; on etcd, where a wait costs a read and a watch stream, it reads the
  entry every ``event_interval``, and at once a loss it posted itself), so a peer's failure
  reaches ``poll()`` as soon as it is posted and ``on_event`` is rung (the agent polls at
  once). It reads ahead only while the agent has taken what was read: O(1) entries a node;
- every ``heartbeat_interval`` (from a thread of its own, ``beat``) it shows this node is
  alive, and judges the next node in the ring (rank + 1 mod n) by heartbeat counters
  (``pulse``; on etcd by its leased key, on every pass: ``ring``); also at once when a rank
  here failed with a peer's error (``look``). It reads the round's counters (stacks and
  status requests, spares, events: ``_skip_hole``) with the next event: one round trip.

From ``announce`` to ``follow`` (the node joins a round) the thread asks the store nothing
(what it read of the round it followed is dropped on ``follow``; a member lost meanwhile is
found by the nodes waiting for its place, ``abandoned``): the beats alone speak for the
store. It starts before the first round forms and beats while the node joins, so the
heartbeats that prove it alive (``fencing``) run on without a gap from before the round
closes, when the others may start watching it.

On a store that can open a second handle on itself (``TwinnedStore``: the agent store) both
threads use handles of their own, their calls bounded (``health.call_bound``); the store's
loss is ``health.StoreHealth``'s to say; the ring watch is ``ring``."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from phalanx.rendezvous.api import EventKind, JobEvent
from phalanx.rendezvous.dynamic.beat import Beater, hedge
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.health import StoreHealth, call_bound, twinned
from phalanx.rendezvous.dynamic.look import Look
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.dynamic.pulse import pulse_for
from phalanx.rendezvous.dynamic.records import count_in
from phalanx.rendezvous.dynamic.ring import RingWatch
from phalanx.rendezvous.fencing import Fence
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import Malformed, StoreTimedOut, StoreUnavailable

log = logging.getLogger("phalanx")


@dataclass(frozen=True)
class _View:
    membership: Membership
    rank: int


class Liveness:
    def __init__(
        self,
        board: Board,
        settings: RendezvousSettings,
        clock: Callable[[], float] = time.monotonic,
        fence: Fence | None = None,
    ) -> None:
        """``clock`` times heartbeats and holes (tests drive ``tick`` with a fake one). ``fence``
        hears of every heartbeat written (counters; a leased store tells it of renewals
        itself), and once it fired the store counts as lost."""
        self._s = settings
        self._clock = clock
        self._fence = fence
        bound = call_bound(settings)
        self._health = StoreHealth(settings, clock)
        self._twins, board, beat_store = twinned(board, bound)
        self._b = board
        self._lock = threading.Lock()
        self._view: _View | None = None
        self._events: deque[JobEvent] = deque()
        self._next_event = 1
        # (index, since): the counter shows slot ``index`` taken but its entry is absent.
        self._hole: tuple[int, float] | None = None
        self._stack_requests = 0  # the newest stacks request of the round seen so far
        self._status_requests = 0  # the same for status requests
        self._spares = 0  # agents queued for the round after the followed one
        # A peer's JOB_STOPPED by a signal, kept for the job's life: the store may go first.
        self._stop_heard: JobEvent | None = None
        proved = fence.proved_alive if fence is not None else (lambda start: None)
        self._pulse = pulse_for(board, settings, clock, proved, beat_store)
        self._beater = Beater(
            self._pulse, settings.heartbeat_interval, bound, hedge(self._pulse, settings, bound),
            answered=self._beat_answered, failed=self._failed, expelled=self._health.expel,
        )  # fmt: skip
        self._ring_watch = RingWatch(board, self._pulse, settings.heartbeat_timeout)
        self._next_beat = 0.0
        self._stop = threading.Event()
        self.look = Look(settings.heartbeat_interval, clock, wakes=not self._twins)
        self._thread: threading.Thread | None = None
        self._ring: Callable[[], None] = lambda: None
        # (view, index): the last wait found that entry absent; its next read is skipped (its
        # write wakes the next wait): a quiet round costs one call per pause.
        self._absent: tuple[_View, int] | None = None
        self._joining = False  # from ``announce`` to ``follow``: no store calls but the beats
        self._followed = threading.Event()  # set by ``follow`` (and ``stop``): wakes the thread

    def _beat_answered(self) -> None:
        with self._lock:  # while the watch pauses (joining) a beat is the thread's whole pass
            joining = self._joining and self._view is not None
        (self._health.recovered if joining else self._health.answered)()

    def follow(self, membership: Membership, rank: int) -> None:
        """Watch ``membership`` from now on (earlier rounds' events and holes dropped). Its
        first event is waited for at once, not read first (where waits park), its duties a
        heartbeat interval on: one call per node as a round forms, not two."""
        with self._lock:
            self._view = view = _View(membership, rank)
            self._absent = (view, 1) if self._twins else None
            self._events.clear()
            self._next_event = 1
            self._hole = None
            self._stack_requests = 0
            self._status_requests = 0
            self._spares = 0
            self._pulse.follow()
            self._ring_watch.follow()
            self._next_beat = self._clock() + self._s.heartbeat_interval
            self._joining = False
        self._followed.set()

    def start(self) -> None:
        """Start the thread (once; later calls do nothing). Until the first ``follow`` it
        only beats."""
        if self._thread is None:
            self._health.answered()
            self._thread = threading.Thread(
                target=self._run, name=f"phalanx-rdzv-{self._b.node_id[:8]}", daemon=True
            )
            self._thread.start()
            self._beater.start(f"phalanx-beat-{self._b.node_id[:8]}")

    def announce(self) -> None:
        """Show this node as alive before it joins a round (a leased key, on etcd); until
        ``follow`` the thread waits for it, not on the store (the round is not known yet)."""
        with self._lock:
            self._joining = True
            self._followed.clear()
        self._pulse.announce()

    def stop_beating(self) -> None:
        """This node left on purpose: no more heartbeats (peers read ``LEFT`` instead), so
        no more proofs either: the fence stands down (no peer waits for this node now).
        Returns once the beats in flight ended (within ``call_bound``)."""
        self._beater.stop_beating()
        if self._fence is not None:
            self._fence.stand_down()

    def on_event(self, ring: Callable[[], None]) -> None:
        """Call ``ring`` (from this thread) when ``next_event`` or ``store_problem`` has
        something new: the agent polls then, not only on its tick."""
        self._ring = ring

    def next_event(self) -> JobEvent | None:
        with self._lock:
            return self._events.popleft() if self._events else None

    def pending_event(self) -> JobEvent | None:
        with self._lock:  # ``next_event``'s, left for it
            return self._events[0] if self._events else None

    def stop_heard(self) -> JobEvent | None:
        """The ``JOB_STOPPED`` of a node stopped by a signal, once read (None: none yet)."""
        with self._lock:
            return self._stop_heard

    def stack_requests(self) -> int:
        """The newest stacks request of the followed round seen so far (0: none)."""
        with self._lock:
            return self._stack_requests

    def saw_stack_request(self, request: int) -> None:
        """This node made ``request``: count it now rather than at the next heartbeat."""
        with self._lock:
            self._stack_requests = max(self._stack_requests, request)

    def status_requests(self) -> int:
        """The newest status request of the followed round seen so far (0: none)."""
        with self._lock:
            return self._status_requests

    def spares(self) -> int:
        """How many agents queued for the round after the followed one, as last read: the
        spares while the round runs with MAX members (a dead one still counts)."""
        with self._lock:
            return self._spares

    def saw_status_request(self, request: int) -> None:
        """This node made ``request``: count it now rather than at the next heartbeat."""
        with self._lock:
            self._status_requests = max(self._status_requests, request)

    def store_problem(self) -> str | None:
        """Why the store counts as lost, or None: errors for two heartbeats in a row, no
        answer at all (a call stuck on a vanished host) for ``heartbeat_timeout``, this
        node's lease expired (the others count it as lost), or it fenced itself (then what
        is known of the store too: see ``settle``)."""
        fenced = self._fence.reason if self._fence is not None else None
        if self._thread is None:
            return fenced
        return self._health.problem(fenced)

    def last_answer(self) -> float:
        """When (``clock``) the store last answered this node's threads (a loss's start)."""
        return self._health.last_ok()

    def fenced(self) -> bool:
        """Whether this node fenced itself (then no store call is worth its timeout)."""
        return self._fence is not None and self._fence.reason is not None

    def settle(self) -> None:
        """After the fence fired: wait for the thread's last store call to end, so that
        ``store_problem`` can say what became of the store, at most until the store would
        have counted as lost anyway (``heartbeat_timeout`` after its last answer)."""
        thread = self._thread
        if self._fence is None or self._fence.reason is None or thread is None:
            return
        until = self._health.last_ok() + self._s.heartbeat_timeout
        thread.join(timeout=max(0.0, until - self._clock()))

    def stop(self) -> None:
        """End the thread; waits at most one heartbeat (a call stuck on a lost store is left
        behind, a daemon). The fence stands down: no heartbeats follow."""
        self._stop.set()
        self._followed.set()
        self.look.wake()
        if self._fence is not None:
            self._fence.stand_down()
        self._beater.stop(self._s.heartbeat_interval)
        if self._thread is not None:
            self._thread.join(timeout=self._s.heartbeat_interval)
        for twin in self._twins:  # (a call still in flight closes its connection after)
            twin.close()

    # -- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        with self.look.running():
            while not self._stop.is_set():
                pause = self._s.event_interval
                try:
                    with self.look.passing():
                        asked = self.tick()
                except Malformed as exc:
                    log.error("rendezvous: %s", exc)
                    self._health.malformed(str(exc))  # final: the same read finds the same junk
                except StoreTimedOut as exc:
                    # No error: the next call goes out on a fresh connection.
                    self._health.timed_out(exc)
                except StoreUnavailable as exc:
                    pause = self._s.heartbeat_interval  # retry gently: each failure may log
                    self._failed(exc)
                else:
                    if asked:
                        self._health.recovered()
                if self.store_problem() is not None:
                    self._beater.stop(0.0)
                    self._ring()
                    return  # STORE_LOST is final: stop knocking on a dead store
                if pause > self._s.event_interval or not self._wait_for_event(pause):
                    self.look.pause(pause)

    def _wait_for_event(self, seconds: float) -> bool:
        """Wait on the store for the followed round's next event (False: not now, the caller
        pauses instead; an error is the next ``tick``'s to meet and count)."""
        with self._lock:
            view, queued, index = self._view, bool(self._events), self._next_event
            joining, until_beat = self._joining, self._next_beat - self._clock()
        if joining:  # no store call: it waits for ``follow`` (or the next pass)
            return self._followed.wait(max(0.0, until_beat)) or True
        if not self._twins:
            return False  # etcd: a wait is a read and a watch stream; a plain read is cheaper
        seconds = max(seconds, until_beat)  # a write wakes the wait: it may last until the beat
        if view is None or queued:
            return False  # joining, or the agent has not taken what was read: no read ahead
        try:
            found = self._b.store.wait([self._b.keys.event(view.membership.round, index)], seconds)
        except (StoreUnavailable, Malformed):
            return False
        if not found:
            with self._lock:
                self._absent = (view, index)
        return True

    def _failed(self, exc: StoreUnavailable) -> None:
        if self._stop.is_set():
            return  # a beat that met its handle closed by ``stop``: nothing to tell
        self._health.failed(exc)

    def tick(self) -> bool:
        """One pass of the thread's work. False: it asked the store nothing (the node joins a
        round: only the beats speak for the store). May raise ``StoreUnavailable``."""
        with self._lock:
            view, absent, self._absent = self._view, self._absent, None
            waited = absent is not None and absent[0] is view and absent[1] == self._next_event
            index, queued, joining = self._next_event, bool(self._events), self._joining
        now = self._clock()
        if due := now >= self._next_beat or self.look.due(now):
            self._next_beat = now + self._s.heartbeat_interval
        if view is None:
            return True  # joining a first round: nobody to judge yet, no reason for doubt
        if joining:  # the round followed ended for this node: finish telling a lost member
            self._ring_watch.tell_untold(view.membership)  # (no call unless a post failed)
            return False
        entry = [] if waited or queued else [self._b.keys.event(view.membership.round, index)]
        told = self._ring_watch.told
        if due:
            self._duties(view, now, index, entry)
        elif self._ring_watch.glances:  # leases: the ring judged every pass (``glance``)
            read = self._ring_watch.glance(view.membership, view.rank, now, entry)
            if entry:
                self._read_events(view, (index, read[0]))
        elif not waited:
            self._read_events(view)
        if self._ring_watch.told != told:  # a loss this pass posted: for this node's agent
            self._read_events(view)  # now, not a pause later (where no wait wakes: etcd)
        return True

    def _duties(self, view: _View, now: float, index: int, entry: list[str]) -> None:
        """A heartbeat pass: the next event's ``entry``, the counters and the heartbeat the
        ring watch judges first, read in one round trip where the store can."""
        r, keys = view.membership.round, self._b.keys
        counted = [keys.round(r, "events"), keys.round(r, "stack_requests"),
                   keys.round(r, "status_requests"), keys.round(r + 1, "waiting")]  # fmt: skip
        ahead = self._ring_watch.ahead(view.membership, view.rank)
        values = self._b.get_many([*entry, *counted, *([ahead] if ahead else [])])
        if entry:
            self._read_events(view, (index, values.pop(0)))
        events, requests, statuses, spares = map(count_in, counted, values[:4])
        self._skip_hole(view, events)
        self._ring_watch.tell_untold(view.membership)  # a post that failed on an earlier tick
        with self._lock:
            if self._view is view:  # not the previous round's count after a switch
                self._stack_requests = max(self._stack_requests, requests)
                self._status_requests = max(self._status_requests, statuses)
                self._spares = spares
        self._ring_watch.watch(view.membership, view.rank, now, {ahead: values[4]} if ahead else {})

    def _read_events(self, view: _View, first: tuple[int, bytes | None] | None = None) -> None:
        """Queue the next event for ``poll()`` unless one is still waiting there (``first``:
        an entry's index and its value, read already)."""
        while True:
            with self._lock:
                if self._view is not view or self._events:
                    return
                index = self._next_event
            r = view.membership.round
            if first is not None and first[0] == index:
                found = self._b.event_in(r, index, first[1])
            else:
                found = self._b.event(r, index)
            first = None
            with self._lock:
                if self._view is not view or self._next_event != index or found is None:
                    return  # switched to a new round meanwhile, or nothing new yet
                self._hole = None
                self._next_event = index + 1
                if found[0] == self._b.node_id:  # a node is not told about itself
                    continue
                if found[1].kind is EventKind.JOB_STOPPED and "signal" in found[1].failure:
                    self._stop_heard = self._stop_heard or found[1]
                self._events.append(found[1])
            self._ring()

    def _skip_hole(self, view: _View, taken_up_to: int) -> None:
        """Step over an entry whose writer died between taking its slot and writing it
        (``taken_up_to``: the event counter, just read). The clock starts when the counter
        first shows the slot taken, not when this reader began waiting for it, and the entry
        is read once more just before it is skipped: a writer that takes the slot right after
        the reader last looked has ``heartbeat_timeout`` to write it, and an entry written at
        the last moment is delivered, never skipped (the counter's read is the only cost)."""
        with self._lock:
            if self._view is not view or self._events:
                return  # the reader is not waiting at a hole while an event is queued
            index, hole = self._next_event, self._hole
        taken = taken_up_to >= index
        now = self._clock()
        with self._lock:
            if self._view is not view or self._next_event != index:
                return
            if not taken:
                self._hole = None
                return
            if hole is None or hole[0] != index:
                self._hole = (index, now)
                return
        if now - hole[1] < self._s.heartbeat_timeout:
            return
        self._read_events(view)  # the last look
        with self._lock:
            if self._view is view and self._next_event == index:  # still absent: skip it
                self._next_event = index + 1
                self._hole = None
