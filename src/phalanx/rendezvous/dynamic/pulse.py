"""How a node shows it is alive, and how the node watching it judges it: counters or leases.

Both use the key ``hb/<node id>``; a node that leaves on purpose overwrites it with ``LEFT``
(a plain write, which on etcd also unbinds it from the lease) and watchers pass over it.
When an agent dies without leaving (SIGKILL, the OOM killer, a crash) its guardian writes
``DIED`` there (``phalanx.rendezvous.lastword``) and watchers count the node lost at once,
without waiting out ``heartbeat_timeout`` or ``lease_ttl``. A node that loses power, its
link or its store connection, or freezes, has no one to say so: that still takes them.

``Counters`` work on every store (c10d, static): each heartbeat the node bumps its counter;
a watcher that sees the value unchanged for ``heartbeat_timeout`` (timed on the watcher's
own clock, so no clock sync is needed) declares the node lost. The watcher's clock starts
after the read that first showed the value, so it never starts before the write of it did:
that is what fencing counts on (``phalanx.rendezvous.fencing``; each successful write is
reported to ``proved`` with the time it started).

``Leases`` need a ``LeasedStore`` (etcd). Before it joins a round the node writes its key
bound to its lease, once; the store deletes the key when the lease expires (the agent died,
or was cut off from the store for ``lease_ttl``), and the watcher that next finds it gone
declares the node lost. A node writes nothing per heartbeat: it reads its own key back
instead, so a node whose lease lapsed while it lived (revoked by an operator, a stall longer
than ``lease_ttl``) learns that the others count it as lost and leaves, instead of running
on as a member nobody waits for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from phalanx.rendezvous.dynamic.board import DIED, LEFT, Board
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import KVStore, LeasedStore

ALIVE = b"alive"  # the value of a leased liveness key (its presence is what counts)
DIED_REASON = "died: its agent was killed or crashed (its guardian said so)"


class Unread(Enum):
    """A key's value not read yet (``judge`` reads it)."""

    UNREAD = "unread"


UNREAD = Unread.UNREAD


class Verdict(Enum):
    ALIVE = "alive"  # certainly alive: it watches the rest of the ring
    QUIET = "quiet"  # not heard from lately, not yet lost: look further along the ring too
    LEFT = "left"  # left on purpose (its fate says so): look further along the ring
    LOST = "lost"


class Pulse(Protocol):
    def announce(self) -> None:
        """Make this node visible as alive; called before it joins each round."""

    def follow(self) -> None:
        """A new round is being watched: forget what was seen of the last one."""

    def beat(self, beating: bool) -> str | None:
        """Once per heartbeat interval. Returns why this node can no longer count as a
        member (final), or None. ``beating`` is False once the node left on purpose."""

    def judge(
        self, node_id: str, now: float, value: bytes | Unread | None = UNREAD
    ) -> tuple[Verdict, str]:
        """Judge ``node_id`` by its key's ``value`` (read here unless given: a caller may
        read it with others in one round trip, after ``now``); for ``LOST`` also say why."""


def pulse_for(
    board: Board,
    settings: RendezvousSettings,
    clock: Callable[[], float] = time.monotonic,
    proved: Callable[[float], None] = lambda start: None,
    beat_store: KVStore | None = None,
) -> Pulse:
    """Leases where the store has them, counters otherwise (``proved``, ``beat_store``: see
    ``Counters``)."""
    if isinstance(board.store, LeasedStore):
        return Leases(board, board.store)
    return Counters(board, settings, clock, proved, beat_store)


@dataclass
class _Seen:
    value: bytes | None
    since: float


class Counters:
    def __init__(
        self,
        board: Board,
        settings: RendezvousSettings,
        clock: Callable[[], float] = time.monotonic,
        proved: Callable[[float], None] = lambda start: None,
        beat_store: KVStore | None = None,
    ) -> None:
        """``proved(start)`` is called after each heartbeat written, with the ``clock`` time
        at which the write began. ``beat_store``: the handle heartbeats are written with
        (connections of their own; default the board's). ``beat`` may run in several
        threads at once (``beat.Beater``): each writes a value of its own, so a proof never
        counts from before the write of the value a watcher reads."""
        self._b = board
        self._beat_store = beat_store or board.store
        self._count_lock = threading.Lock()
        self._s = settings
        self._clock = clock
        self._proved = proved
        self._key = board.keys.heartbeat(board.node_id)
        self._beats = 0
        self._seen: dict[str, _Seen] = {}

    def announce(self) -> None:
        pass  # the first beat follows the first round; until then nobody watches this node

    def follow(self) -> None:
        self._seen = {}

    def beat(self, beating: bool) -> str | None:
        if beating:
            with self._count_lock:
                self._beats += 1
                value = str(self._beats).encode()
            start = self._clock()
            self._beat_store.set(self._key, value)
            self._proved(start)
        else:
            self._beat_store.set(self._key, LEFT)
        return None

    def judge(
        self, node_id: str, now: float, value: bytes | Unread | None = UNREAD
    ) -> tuple[Verdict, str]:
        if isinstance(value, Unread):
            value = self._b.store.get(self._b.keys.heartbeat(node_id))
        if value == LEFT:
            return Verdict.LEFT, ""
        if value == DIED:
            return Verdict.LOST, DIED_REASON
        seen = self._seen.get(node_id)
        if seen is None or seen.value != value:
            # From after the read (``now`` was taken before it, maybe long before, when a
            # call ahead of it was slow): the silence never counts from before the write.
            self._seen[node_id] = seen = _Seen(value, max(now, self._clock()))
        silent = now - seen.since
        if silent >= self._s.heartbeat_timeout:
            return Verdict.LOST, f"sent no heartbeat for {silent:.0f} s"
        if silent < 2 * self._s.heartbeat_interval:
            return Verdict.ALIVE, ""
        return Verdict.QUIET, ""


class Leases:
    def __init__(self, board: Board, store: LeasedStore) -> None:
        self._b = board
        self._store = store
        self._key = board.keys.heartbeat(board.node_id)
        self._announced = False

    def announce(self) -> None:
        self._store.set_ephemeral(self._key, ALIVE)
        self._announced = True

    def follow(self) -> None:
        pass

    def beat(self, beating: bool) -> str | None:
        if not beating or not self._announced:
            return None
        if self._store.get(self._key) is None:
            return (
                "this node's lease on the rendezvous store expired (it could not renew it "
                "within lease_ttl), so the other nodes count it as lost"
            )
        return None

    def judge(
        self, node_id: str, now: float, value: bytes | Unread | None = UNREAD
    ) -> tuple[Verdict, str]:
        if isinstance(value, Unread):
            value = self._store.get(self._b.keys.heartbeat(node_id))
        if value == LEFT:
            return Verdict.LEFT, ""
        if value == DIED:
            return Verdict.LOST, DIED_REASON
        if value is None:
            return Verdict.LOST, (
                "lost its lease on the rendezvous store (the agent died, or could not reach "
                "the store for lease_ttl)"
            )
        return Verdict.ALIVE, ""
