"""The nodes queued for a round, and when a restart round closes without them.

A node that finds round t-1 running without it (a spare beyond MAX, or a newcomer to a job
below MAX) queues for round t: it counts itself in ``r<t>/waiting`` and writes its node id
under ``r<t>/queued/<n>``, so a closing node can judge whether it still beats. It beats
while it waits (``liveness``), with the same heartbeat (or lease) as a member.

Why: a spare that hiccups (a pause, a long GC, a SIGSTOP) at the moment a member is lost
used to miss the restart round's last call, and the round closed with too few nodes and
ended the job although the spare was back a second later. So a restart round waits for
every queued node that still beats (``restart_close``): one whose heartbeat did not change
for ``heartbeat_timeout`` (as this node's clock times it, from its first look: no clock
sync needed; on etcd, one whose lease lapsed), that left, or that died (its guardian said
so) is lost and no longer waited for. The whole wait ends ``heartbeat_timeout`` after the
last call (within the join timeout): the beats come from a thread of their own, so a node
whose main thread is stuck (a full stderr pipe, a slow run directory) beats on but never
joins, and one that can join does so within that time.

Cost: none while nothing is missing; while a restart round waits past its last call, one
read of the queue counter and of each queued node's heartbeat per heartbeat interval.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from phalanx.rendezvous.api import EventKind, JobEvent
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.members import Arrival
from phalanx.rendezvous.dynamic.pulse import Verdict, pulse_for
from phalanx.rendezvous.settings import RendezvousSettings


def restart_close(
    joined: int,
    survivors: int,
    queued: int,
    live: int,
    nodes: tuple[int, int],
    last_call_over: bool,
) -> int | None:
    """How many arrivals restart round t closes with now, 0: it fails (too few), None: wait.

    ``joined``: arrivals so far; ``survivors``: members of round t-1 that rejoined (all of
    them settled); ``queued``: nodes queued for round t; ``live``: those of them not found
    lost (whether they joined already or not); ``nodes``: (MIN, MAX). Everyone expected in:
    at once. Otherwise the last call, and after it a wait while a queued node that still
    beats has a place and is not in yet (then it fails below MIN, or runs with those in)."""
    low, high = nodes
    if joined >= max(low, min(high, survivors + queued)):
        return min(joined, high)
    if not last_call_over or joined < min(high, survivors + live):
        return None
    return min(joined, high) if joined >= low else 0


class QueuedNodes:
    """The queue of a round: ``record`` a node in it, count how many ``live``."""

    def __init__(
        self,
        board: Board,
        settings: RendezvousSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._b = board
        self._s = settings
        self._clock = clock
        self._pulse = pulse_for(board, settings, clock)  # only its ``judge`` is used
        self._ids: dict[tuple[int, int], str] = {}  # (round, place) -> node id, read once
        self._holes: dict[tuple[int, int], float] = {}  # place taken, id not seen: since

    def queue(self, t: int, me: Arrival, max_nodes: int) -> None:
        """Queue ``me`` for round ``t``, as round t-1 runs without it; if that round has room
        (fewer than ``max_nodes``), its members see ``NODE_WAITING`` and re-form with it."""
        self.record(t, me.node_id)
        running = self._b.decision(t - 1)
        if running is not None and not running.failed and running.count < max_nodes:
            detail = f"node {me.hostname} ({me.addr}) waits to join (round {t})"
            self._b.post_event(t - 1, JobEvent(EventKind.NODE_WAITING, detail=detail), me.node_id)

    def record(self, t: int, node_id: str) -> None:
        """Queue ``node_id`` for round ``t``."""
        place = self._b.store.add(self._b.keys.round(t, "waiting"), 1)
        self._b.store.set(self._b.keys.queued(t, place), node_id.encode())

    def count(self, t: int) -> int:
        """How many nodes queued for round ``t`` (those that died since included)."""
        return self._b.read_int(self._b.keys.round(t, "waiting"))

    def live(self, t: int, queued: int) -> int:
        """How many of the first ``queued`` nodes queued for round ``t`` still beat. A place
        taken whose id is not written yet counts for ``heartbeat_timeout`` (its writer may
        have died in between)."""
        now = self._clock()
        alive = 0
        for place in range(1, queued + 1):
            node_id = self._id(t, place)
            if node_id is None:
                since = self._holes.setdefault((t, place), now)
                alive += now - since < self._s.heartbeat_timeout
                continue
            verdict, _ = self._pulse.judge(node_id, now)
            alive += verdict in (Verdict.ALIVE, Verdict.QUIET)
        return alive

    def _id(self, t: int, place: int) -> str | None:
        found = self._ids.get((t, place))
        if found is None:
            data = self._b.store.get(self._b.keys.queued(t, place))
            if data is None:
                return None
            found = self._ids[(t, place)] = data.decode(errors="replace")
        return found
