"""A spare that loses the job's store, as pure decisions (``rendezvous.dynamic.follow``): which
store it follows the job to, over in-memory stores. The real thing (four agents in network
namespaces, the store's host SIGKILLed, the spare in the restart round) is
``tests/multinode/test_spare_follows_store.py``."""

from __future__ import annotations

import threading
import time

import pytest

from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.failover import Candidate, Failover
from phalanx.rendezvous.dynamic.follow import Follow, newest, running, signposted
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.dynamic.records import encode
from phalanx.rendezvous.dynamic.waiting import Waiting, waiting_text
from phalanx.rendezvous.lastword import Reach
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import KVStore, Malformed, StoreUnavailable
from support.memory_store import MemoryServer, MemoryStore
from support.rounds import KEYS, ROUND

LOST = Candidate("10.0.0.1", 29400)
PLACES = [LOST, Candidate("10.0.0.2", 29400), Candidate("10.0.0.3", 29400)]


class Listed:
    """``Successors`` with listed candidates over in-memory stores (``serving``)."""

    def __init__(self) -> None:
        self.current, self.epoch = LOST, 0
        self.serving: dict[Candidate, MemoryServer] = {}
        self.reached = 0  # tries at a candidate, answered or not

    def candidates(self, membership: Membership) -> list[Candidate]:
        return list(PLACES)

    def is_current(self, candidate: Candidate) -> bool:
        return candidate == self.current

    def reach(self, candidate: Candidate, timeout: float) -> KVStore | None:
        self.reached += 1
        server = self.serving.get(candidate)
        return None if server is None else MemoryStore(server)

    def moved(self, candidate: Candidate) -> Reach:
        self.current = candidate
        return {"store": "memory", "at": str(candidate)}

    def serve_at(self, i: int, epoch: int, sure: bool) -> None:
        server = self.serving[PLACES[i]] = MemoryServer()
        server.data[KEYS.epoch] = str(epoch).encode()
        if sure:
            server.data[KEYS.confirmed] = encode({"epoch": epoch, "round": 5})


@pytest.mark.parametrize(
    ("serving", "lost", "found", "pending"),
    [
        ([], 0, None, None),  # nobody serves yet: look again
        ([(1, 1, False)], 0, None, (1, 1)),  # no quorum reached it (yet): waited on, not joined
        ([(1, 1, False), (2, 2, False)], 0, None, (2, 2)),  # the newest of those
        ([(1, 1, True)], 0, (1, 1), None),  # the confirmed successor
        ([(1, 1, True), (2, 2, True)], 0, (2, 2), None),  # the newest confirmed one
        ([(1, 1, True), (2, 2, False)], 0, (1, 1), None),  # a newer unconfirmed one is passed by
        ([(2, 0, True)], 0, None, None),  # a fresh first store elsewhere (an agent started again)
        ([(0, 0, True)], 0, (0, 0), None),  # the lost store answers again (its id: ``reach``)
        ([(0, 1, True), (2, 2, True)], 1, (2, 2), None),  # ... but the job moved on: there
        ([(1, 1, True)], 1, None, None),  # the store it lost, not newer (``current``: the lost)
    ],
)
def test_the_store_a_spare_follows(
    serving: list[tuple[int, int, bool]],
    lost: int,
    found: tuple[int, int] | None,
    pending: tuple[int, int] | None,
) -> None:
    places = Listed()
    for i, epoch, sure in serving:
        places.serve_at(i, epoch, sure)
    got, unsure = newest(PLACES, places, KEYS, lost)
    assert (None if got is None else (PLACES.index(got[0]), got[2])) == found
    assert (None if unsure is None else (PLACES.index(unsure[0]), unsure[2])) == pending


def test_a_spare_joins_the_successor_as_its_quorum_confirms_it_not_a_look_later() -> None:
    """The look finds the successor serving, not yet confirmed: the spare waits on that
    store's mark (``follow.confirmation``) and moves once the member completing the quorum
    writes it -- woken by that write, with no second look (``EVERY`` later, before)."""
    places = Listed()
    places.serve_at(1, 1, False)
    server = places.serving[PLACES[1]]

    def quorum_completes() -> None:  # once the spare waits on the mark (or, if it never
        end = time.monotonic() + 5  # does, 5 s on: then it finds it at its next look)
        while time.monotonic() < end:
            with server.lock:
                if server.waiters.get(KEYS.confirmed):
                    break
            time.sleep(0.001)
        MemoryStore(server).set(KEYS.confirmed, encode({"epoch": 1, "round": 5}))

    member = threading.Thread(target=quorum_completes, daemon=True)
    member.start()
    move = _follow(places, patience=60).follow(KEYS, StoreUnavailable("gone"))
    member.join(10)
    assert move is not None and move.candidate == PLACES[1] and move.epoch == 1
    assert places.reached == len(PLACES)  # one look: each candidate tried once


def _follow(places: Listed, members: Membership = ROUND, patience: float = 0) -> Follow:
    """A spare's ``Follow`` that stood by behind round ``members`` (``patience``: its
    join_timeout; none by default)."""
    settings = RendezvousSettings(join_timeout=patience)
    follow = Follow(Failover(places, RendezvousSettings()), settings)
    board = Board(MemoryStore(MemoryServer()), KEYS, "spare")
    board.put_first(KEYS.round(members.round, "members"), members.to_json())
    board.open_round(members.round)
    follow.watch(board)
    return follow


def test_a_spare_that_stood_by_follows_and_takes_the_new_epoch() -> None:
    places = Listed()
    places.serve_at(1, 1, True)
    failover = Failover(places, RendezvousSettings())
    follow = Follow(failover, RendezvousSettings(join_timeout=1))
    board = Board(MemoryStore(MemoryServer()), KEYS, "spare")
    board.put_first(KEYS.round(ROUND.round, "members"), ROUND.to_json())
    board.open_round(ROUND.round + 1)  # a restart round forming: the round before is the one
    assert running(board) == ROUND
    follow.watch(board)
    move = follow.follow(KEYS, StoreUnavailable("gone"))
    assert move is not None and move.candidate == PLACES[1] and move.epoch == 1
    assert failover.epoch == 1 and places.current == PLACES[1] and move.reach is not None


def test_no_follow_for_a_member_junk_a_round_of_two_or_no_store_at_all() -> None:
    places = Listed()
    places.serve_at(1, 1, True)
    member = Follow(Failover(places, RendezvousSettings()), RendezvousSettings())
    assert member.follow(KEYS, StoreUnavailable("gone")) is None  # it never stood by
    assert _follow(places).follow(KEYS, Malformed("junk")) is None  # not lost: junk
    two = Membership(4, 0, ("a", "b"), ROUND.nodes[:2])
    assert _follow(places, two).follow(KEYS, StoreUnavailable("gone")) is None
    assert _follow(Listed()).follow(KEYS, StoreUnavailable("gone")) is None  # none came
    assert _follow(places).follow(KEYS, StoreUnavailable("gone")) is not None  # (as above)
    assert Follow(None, RendezvousSettings()).follow(KEYS, StoreUnavailable("x")) is None


@pytest.mark.parametrize(
    ("word", "serving", "found"),
    [
        (None, [(1, 1, True)], None),  # no word left: it waits where it is
        ({"host": "10.0.0.2", "port": 29400, "epoch": 1}, [(1, 1, True)], (1, 1)),
        ({"host": "10.0.0.2", "port": 29400, "epoch": 1}, [(1, 1, False)], None),  # unconfirmed
        ({"host": "10.0.0.2", "port": 29400, "epoch": 1}, [], None),  # not answering (yet)
        ({"host": "10.0.0.2", "port": 29400, "epoch": 2}, [(1, 1, True)], None),  # older there
        ({"host": "10.0.0.3", "port": 29400, "epoch": 1}, [(2, 2, True)], (2, 2)),  # newer: ok
        ({"host": "10.0.0.2", "port": 29400, "epoch": 0}, [(1, 0, True)], None),  # no failover
        ({"host": "10.0.0.2"}, [(1, 1, True)], None),  # junk: not the job's word
    ],
)
def test_a_newcomer_on_a_fresh_store_follows_the_word_the_job_left_there(
    word: dict[str, object] | None, serving: list[tuple[int, int, bool]], found: object
) -> None:
    """A node given one endpoint, waiting on a fresh store at the lost store's place, follows
    the successor's word there to a confirmed store only (``follow.signposted``)."""
    places = Listed()
    for i, epoch, sure in serving:
        places.serve_at(i, epoch, sure)
    fresh = MemoryStore(MemoryServer(), hosting=True)
    if word is not None:
        fresh.set(KEYS.moved, encode(word))
    failover = Failover(places, RendezvousSettings())
    first = "the c10d store at 10.0.0.1:29400"
    move = signposted(Board(fresh, KEYS, "newcomer"), failover)
    got = None if move is None else (PLACES.index(move.candidate), move.epoch)
    assert got == found
    if move is None:
        assert (
            failover.epoch == 0 and places.current == LOST and failover.waiting_at(first) == first
        )
        return
    assert failover.epoch == move.epoch and places.current == move.candidate
    assert move.reach is not None  # a client of it, served elsewhere
    # The waiting line names the store it waits at now, not the lost first one.
    line = waiting_text(Waiting(1, 2, ("a", "b")), 3, 3, 30, failover.waiting_at(first))
    assert line.endswith(f"rendezvous: the store that took over, at {move.candidate} "
                         f"(failover {move.epoch})"), line  # fmt: skip
