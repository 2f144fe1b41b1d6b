"""A member found lost is told to its round once, and surely (review findings 6 and 7 of
issue 37; ``rendezvous.dynamic.lost``).

- A node cut off longer than ``heartbeat_timeout`` but back within ``close_timeout`` is
  found lost by its watcher, who posts its record and ``NODE_LOST``; coming back, the node
  does not post a second of each (simulated agents on the in-memory store, ``memcluster``:
  the race is in the rendezvous algorithm). The report counts a lost node once whatever
  the store holds (``record_exits``).
- A watcher whose post of ``NODE_LOST`` failed (a store call timed out after the record
  went in) posts it on its next tick: its place is settled, no other watcher will (the
  watcher's thread driven by hand, on a fake clock, as in ``test_rdzv_liveness``).
"""

from __future__ import annotations

import threading

import pytest

from phalanx.rendezvous.api import EventKind, NodeInfo
from phalanx.rendezvous.dynamic.board import DIED, Board
from phalanx.rendezvous.dynamic.handler import DynamicRendezvous
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.liveness import Liveness
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import StoreUnavailable
from phalanx.report.job import record_exits
from support.memcluster import FAST, Cluster, Join, form, wait_event
from support.memory_store import MemoryServer, MemoryStore, _Locked


class CutStore(MemoryStore):
    """A node's handle whose link can be cut and healed: while ``cut``, every call fails as
    a store out of reach does (``StoreUnavailable``)."""

    def __init__(self, server: MemoryServer) -> None:
        super().__init__(server)
        self.cut = threading.Event()

    def _locked(self) -> _Locked:
        if self.cut.is_set():
            raise StoreUnavailable("the link to the in-memory store is cut")
        return super()._locked()


def lost_told(board: Board, r: int) -> tuple[list[dict[str, object]], list[int | None]]:
    """Round ``r``'s ``node_lost`` records in the failure log, and the node ranks of the
    ``NODE_LOST`` entries of its event log."""
    records = [f for f in board.failures() if f.get("kind") == "node_lost" and f["round"] == r]
    events = []
    for index in range(1, board.event_count(r) + 1):
        found = board.event(r, index)
        if found is not None and found[1].kind is EventKind.NODE_LOST:
            events.append(found[1].node_rank)
    return records, events


def test_a_node_found_lost_and_back_is_told_once(cluster: Cluster) -> None:
    """Node b's link cut until a has found it lost (heartbeat_timeout 4 s) and b itself knows
    it lost the store; healed, b comes back as a new member: round 0 holds one record and
    one ``NODE_LOST`` about b (there were two: b's own on top of its watcher's)."""
    a = cluster.node("a", hosting=True)
    link = CutStore(cluster.server)
    b = DynamicRendezvous(
        link, run_id="job", min_nodes=2, max_nodes=2, addr="addr-b", hostname="b", settings=FAST
    )
    cluster.handlers.append(b)
    first = {r.this_node.hostname: r for r in form(a, b)}
    link.cut.set()
    try:
        assert wait_event(a, EventKind.NODE_LOST).node_rank == first["b"].node_rank
        wait_event(b, EventKind.STORE_LOST)
    finally:
        link.cut.clear()
    assert b.rejoin()
    again = Join(b)
    records, events = lost_told(a._board, 0)
    assert len(records) == 1 and events == [first["b"].node_rank], (records, events)
    assert "rejoins as a new member" not in str(records[0]["reason"])  # its watcher's
    assert len(record_exits(records + records)) == 1  # (the report counts it once anyway)
    second = Join(a).result(), again.result()
    assert [r.round for r in second] == [1, 1]


# -- a post that failed is finished on the next tick ---------------------------------------------

KEYS = Keys("job")
SETTINGS = RendezvousSettings(heartbeat_interval=1.0, heartbeat_timeout=10.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FailingOnce(MemoryStore):
    """A handle whose first write of ``key`` fails (a reply that timed out)."""

    def __init__(self, server: MemoryServer, key: str) -> None:
        super().__init__(server)
        self._key, self._failed = key, False

    def set(self, key: str, value: bytes) -> None:
        if key == self._key and not self._failed:
            self._failed = True
            raise StoreUnavailable(f"timed out writing {key}")
        super().set(key, value)


def test_a_lost_node_whose_event_did_not_go_out_is_told_on_the_next_tick() -> None:
    """The watcher settles node 1 as lost (its guardian said it died) and posts its record;
    the post of ``NODE_LOST`` fails. The next tick posts it, once; the record is not posted
    again."""
    server = MemoryServer()
    clock = Clock()
    store = FailingOnce(server, KEYS.event(0, 1))
    watcher = Liveness(Board(store, KEYS, "watcher"), SETTINGS, clock=clock)
    nodes = (NodeInfo(0, "watcher", "addr-w", 1), NodeInfo(1, "gone", "addr-g", 1))
    watcher.follow(Membership(0, 0, ("watcher", "gone"), nodes), 0)
    other = Board(MemoryStore(server), KEYS, "other")
    other.store.set(KEYS.heartbeat("gone"), DIED)  # its guardian's last word
    clock.now += SETTINGS.heartbeat_interval  # (a round's duties begin an interval on)
    with pytest.raises(StoreUnavailable):
        watcher.tick()  # (the thread's loop takes it as one failed call, and goes on)
    records, events = lost_told(other, 0)
    assert len(records) == 1 and events == [], (records, events)  # the record only, so far
    clock.now += SETTINGS.heartbeat_interval
    watcher.tick()
    records, events = lost_told(other, 0)
    assert len(records) == 1 and events == [1], (records, events)
