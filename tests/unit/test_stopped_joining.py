"""A node stopped while it joins a round that already closed with it (the pure parts; the
real agents: ``tests/rendezvous/test_stopped_while_joining.py``).

``placed_in`` finds that round and the node's rank in it, from the membership or, before
slot 1 wrote it, from the arrivals; ``tell_left_while_joining`` leaves that round as a
running member leaves it; the ring watch counts a ``LEFT`` heartbeat whose place in the
followed round never settles lost after ``heartbeat_timeout``, as it does stopped beats.
On an in-memory store, the clock by hand.
"""

from __future__ import annotations

import signal

import pytest

from phalanx.rendezvous.api import EventKind, NodeInfo
from phalanx.rendezvous.dynamic.board import LEFT, Board, Decision
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.members import Arrival, Membership
from phalanx.rendezvous.dynamic.pulse import Counters, Verdict
from phalanx.rendezvous.dynamic.records import encode
from phalanx.rendezvous.dynamic.ring import RingWatch
from phalanx.rendezvous.dynamic.stopping import Placed, placed_in, tell_left_while_joining
from phalanx.rendezvous.settings import RendezvousSettings
from support.memory_store import MemoryServer, MemoryStore

KEYS = Keys("job")
SETTINGS = RendezvousSettings(heartbeat_interval=1.0, heartbeat_timeout=10.0)
# Round 1, a restart: a (node rank 0 before) joined first, b (node rank 1 before) second.
ARRIVALS = (
    Arrival("a", "ha", "10.0.0.1", 1, prev_rank=0, prev_round=0),
    Arrival("b", "hb", "10.0.0.2", 1, prev_rank=1, prev_round=0),
)
ROUND = Membership(
    1, 1, ("a", "b"), (NodeInfo(0, "ha", "10.0.0.1", 1), NodeInfo(1, "hb", "10.0.0.2", 1))
)


def board(node_id: str, server: MemoryServer) -> Board:
    return Board(MemoryStore(server), KEYS, node_id)


def closed_round(
    *, arrivals: tuple[Arrival, ...] = ARRIVALS, members: bool, count: int = 2
) -> MemoryServer:
    """Round 1 opened and closed with ``count`` arrivals (``arrivals`` written), its
    membership written or not yet."""
    server = MemoryServer()
    writer = board("w", server)
    writer.open_round(1)
    for slot, arrival in enumerate(arrivals, 1):
        writer.store.set(KEYS.node(1, slot), encode(arrival.to_json()))
    writer.close(1, Decision(count=count))
    if members:
        writer.put_first(KEYS.round(1, "members"), ROUND.to_json())
    return server


@pytest.mark.parametrize("members", [True, False], ids=["membership", "arrivals"])
def test_the_round_that_closed_with_the_node_is_found_with_its_rank(members: bool) -> None:
    server = closed_round(members=members)
    assert placed_in(board("b", server), 0) == Placed(1, 1, 2)
    assert placed_in(board("a", server), 0) == Placed(1, 0, 2)
    assert placed_in(board("c", server), 0) is None  # it queued: the round runs without it
    assert placed_in(board("b", server), 1) is None  # not newer than the round it was in
    assert placed_in(board("b", server), -1) == Placed(1, 1, 2)  # a newcomer's first round


def test_no_place_while_an_arrival_is_missing_or_the_round_failed_or_is_open() -> None:
    # Slot 1 counted, its arrival not written yet: the ranks are not known.
    assert placed_in(board("b", closed_round(arrivals=ARRIVALS[1:], members=False)), 0) is None
    server = MemoryServer()
    writer = board("w", server)
    writer.open_round(1)
    assert placed_in(board("b", server), 0) is None  # open, not closed
    writer.close(1, Decision(failure="only 1 node(s) are left"))
    assert placed_in(board("b", server), 0) is None


def test_a_node_placed_leaves_that_round_and_its_members_hear_the_job_stopped() -> None:
    server = closed_round(members=False)
    b = board("b", server)
    tell_left_while_joining(b, Placed(1, 1, 2), "hb", "10.0.0.2", signal.SIGTERM, False)
    assert b.store.get(KEYS.heartbeat("b")) == LEFT
    assert (b.store.get(KEYS.fate(1, 1)) or b"").startswith(b"left:")
    assert b.event_count(1) == 1
    about, event = b.event(1, 1) or ("", None)
    assert about == "b" and event is not None and event.kind is EventKind.JOB_STOPPED
    assert event.node_rank == 1 and event.failure == {"signal": signal.SIGTERM}
    assert "was stopped by SIGTERM" in event.detail
    assert b.stop_signal() == (signal.SIGTERM, False, "node 1")


def test_a_node_not_placed_stops_the_job_for_those_still_joining() -> None:
    server = MemoryServer()
    b = board("b", server)
    tell_left_while_joining(b, None, "hb", "10.0.0.2", signal.SIGINT, False)
    assert b.stop_signal() == (signal.SIGINT, False, "a node that was joining")
    assert b.store.get(KEYS.heartbeat("b")) is None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watch_from_a(server: MemoryServer) -> tuple[RingWatch, Board, Clock]:
    clock = Clock()
    a = board("a", server)
    ring = RingWatch(a, Counters(a, SETTINGS, clock), SETTINGS.heartbeat_timeout)
    ring.follow()
    return ring, a, clock


def test_a_left_heartbeat_with_no_place_settled_in_the_round_is_lost_after_the_timeout() -> None:
    """b left an earlier round (its heartbeat: ``LEFT``) and never settled its place in this
    one: a silence, lost after heartbeat_timeout and told to the round."""
    server = closed_round(members=True)
    ring, a, clock = watch_from_a(server)
    a.store.set(KEYS.heartbeat("b"), LEFT)
    ring.watch(ROUND, 0, clock.now)
    clock.now += SETTINGS.heartbeat_timeout - 0.5
    ring.watch(ROUND, 0, clock.now)
    assert a.store.get(KEYS.fate(1, 1)) is None  # not yet
    clock.now += 1.0
    ring.watch(ROUND, 0, clock.now)
    assert (a.store.get(KEYS.fate(1, 1)) or b"").startswith(b"lost:")
    _, event = a.event(1, 1) or ("", None)
    assert event is not None and event.kind is EventKind.NODE_LOST and event.node_rank == 1
    assert "its heartbeat says it left" in event.detail


def test_a_left_heartbeat_with_its_place_settled_is_passed_over_for_good() -> None:
    server = closed_round(members=True)
    ring, a, clock = watch_from_a(server)
    a.store.set(KEYS.heartbeat("b"), LEFT)
    a.settle(1, 1, 2, "left")
    for _ in range(3):
        ring.watch(ROUND, 0, clock.now)
        clock.now += SETTINGS.heartbeat_timeout
    assert (a.store.get(KEYS.fate(1, 1)) or b"").startswith(b"left:")
    assert a.event_count(1) == 0


def test_a_member_whose_heartbeat_key_was_never_written_is_lost_after_the_timeout() -> None:
    """Already so before this change (the CI hang was the ``LEFT``, not this): a member that
    never beat is judged from the first read, as one whose beats stopped."""
    server = closed_round(members=True)
    clock = Clock()
    a = board("a", server)
    pulse = Counters(a, SETTINGS, clock)
    assert pulse.judge("b", clock.now)[0] is Verdict.ALIVE
    clock.now += SETTINGS.heartbeat_timeout
    verdict, why = pulse.judge("b", clock.now)
    assert verdict is Verdict.LOST and "no heartbeat" in why
