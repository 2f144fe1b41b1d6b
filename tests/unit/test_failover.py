"""The store's failover as pure decisions (``rendezvous.dynamic.failover``): the quorum, the
walk to the successor, what the survivors re-publish, over the in-memory store. The real
thing (agents in network namespaces, the host SIGKILLed, frozen, cut off) is in
``tests/multinode/test_store_failover.py``."""

from __future__ import annotations

import pytest

from phalanx.rendezvous.api import RoundVerdict
from phalanx.rendezvous.dynamic.board import Board, Decision
from phalanx.rendezvous.dynamic.failover import (
    Candidate,
    Failover,
    epoch_of,
    republish,
    superseded,
    walk,
)
from phalanx.rendezvous.dynamic.majority import failed_over, quorum
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.lastword import Reach
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.agentstore import Token
from phalanx.rendezvous.stores.base import KVStore
from support.memory_store import MemoryServer, MemoryStore
from support.rounds import KEYS, ROUND


@pytest.mark.parametrize(
    ("min_nodes", "members", "failed_over", "need"),
    [
        (2, 3, True, 2),  # the job: 2 survivors of 3 go on
        (2, 3, False, 2),  # the cut-off host alone (1) is below it
        (1, 3, True, 2),  # MIN 1 does not let one survivor of 3 go on
        (1, 3, False, 2),  # ... nor the cut-off host alone
        (1, 4, False, 2),  # a half of the old store's side may go on ...
        (1, 4, True, 3),  # ... and then the other half may not
        (1, 2, False, 1),  # a job of 2 never fails over: MIN only, as before
        (1, 2, True, 1),
        (4, 5, True, 4),  # MIN above the majority wins
    ],
)
def test_the_quorum(min_nodes: int, members: int, failed_over: bool, need: int) -> None:
    assert quorum(min_nodes, members, failed_over) == need


@pytest.mark.parametrize("members", range(3, 9))
def test_no_two_sides_of_a_partition_both_reach_their_quorum(members: int) -> None:
    for stayed in range(members + 1):
        moved = members - stayed
        assert not (stayed >= quorum(1, members, False) and moved >= quorum(1, members, True)), (
            stayed,
            moved,
        )


class Places:
    """``Successors`` over in-memory stores: ``serving`` maps a candidate to its server."""

    def __init__(self, current: Candidate, me: int, *, bind_fails: bool = False) -> None:
        self.current, self.me, self.bind_fails = current, me, bind_fails
        self.epoch = 0
        self.serving: dict[Candidate, MemoryServer] = {}
        self.tries: list[Candidate] = []

    def candidates(self, membership: Membership) -> list[Candidate]:
        return [Candidate(n.addr, 29400, n.node_rank) for n in membership.nodes]

    def is_current(self, candidate: Candidate) -> bool:
        return candidate == self.current

    def is_me(self, candidate: Candidate, rank: int) -> bool:
        return candidate.node_rank == rank

    def at_member(self, candidate: Candidate, membership: Membership) -> bool:
        return candidate.node_rank is not None

    def store_host(self, membership: Membership) -> int | None:
        return self.current.node_rank

    def serve(self, candidate: Candidate, seed: dict[str, bytes]) -> KVStore | None:
        if self.bind_fails:
            return None
        server = self.serving[candidate] = MemoryServer()
        server.data.update(seed)
        return MemoryStore(server, hosting=True)

    def reach(self, candidate: Candidate, timeout: float) -> KVStore | None:
        self.tries.append(candidate)
        server = self.serving.get(candidate)
        return None if server is None else MemoryStore(server)

    def moved(self, candidate: Candidate) -> Reach:
        self.current = candidate
        return {"store": "memory", "at": str(candidate)}


def _candidates(places: Places) -> list[Candidate]:
    return places.candidates(ROUND)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.5  # every look costs time: a wait that never ends is a failed test
        return self.now


def test_the_first_survivor_in_the_order_serves_the_next_store() -> None:
    lost = Candidate("10.0.0.1", 29400, 0)
    places = Places(lost, me=1)
    found = walk(_candidates(places), places, 1, 1, KEYS, patience=3, clock=Clock())
    assert found is not None
    where, store, served = found
    assert (where, served) == (Candidate("10.0.0.2", 29400, 1), True)
    assert epoch_of(store, KEYS) == 1
    # the lost store got one try, the later candidate one look (does it serve already?);
    # nobody was waited for
    assert places.tries == [lost, Candidate("10.0.0.3", 29400, 2)]


def test_a_late_first_survivor_joins_the_store_a_later_one_served_in_its_place() -> None:
    """Node 2 waited for node 1 in vain (node 1 late under load) and served: node 1 joins
    it rather than serve a second store that would split the survivors, neither a quorum."""
    lost = Candidate("10.0.0.1", 29400, 0)
    later = Candidate("10.0.0.3", 29400, 2)
    places = Places(lost, me=1)
    served = places.serving[later] = MemoryServer()
    served.data[KEYS.epoch] = b"1"
    found = walk(_candidates(places), places, 1, 1, KEYS, patience=3, clock=Clock())
    assert found is not None and found[:1] == (later,) and not found[2]
    assert Candidate("10.0.0.2", 29400, 1) not in places.serving  # no second store


def test_the_next_survivor_finds_it_and_passes_an_older_store_by() -> None:
    lost = Candidate("10.0.0.1", 29400, 0)
    successor = Candidate("10.0.0.2", 29400, 1)
    places = Places(lost, me=2)
    older = places.serving[successor] = MemoryServer()  # an old store still there: epoch 0
    found = walk(_candidates(places), places, 2, 1, KEYS, patience=3, clock=Clock())
    assert found is not None and found[2]  # not found at the successor: it served itself
    older.data[KEYS.epoch] = b"1"
    places = Places(lost, me=2)
    places.serving[successor] = older
    found = walk(_candidates(places), places, 2, 1, KEYS, patience=3, clock=Clock())
    assert found is not None and found[:1] == (successor,) and not found[2]


def test_a_lost_store_that_answers_after_all_is_rejoined() -> None:
    lost = Candidate("10.0.0.1", 29400, 0)
    places = Places(lost, me=1)
    places.serving[lost] = MemoryServer()
    assert walk(_candidates(places), places, 1, 1, KEYS, patience=3, clock=Clock()) is None


def test_a_survivor_that_cannot_serve_walks_on_and_nobody_serving_is_none() -> None:
    lost = Candidate("10.0.0.1", 29400, 0)
    places = Places(lost, me=1, bind_fails=True)
    assert walk(_candidates(places), places, 1, 1, KEYS, patience=1, clock=Clock()) is None
    assert places.tries.count(Candidate("10.0.0.3", 29400, 2)) >= 1  # waited for, then not


def test_republished_once_whoever_writes_it() -> None:
    server = MemoryServer()
    server.data[KEYS.epoch] = b"1"
    before = RoundVerdict("rank 1: exit 3", "", True)
    for node in ("a", "b"):  # both survivors, in turn
        board = Board(MemoryStore(server), KEYS, node)
        republish(board, ROUND, 0, "served the store and was lost", 1.0, before)
    board = Board(MemoryStore(server), KEYS, "x")
    assert board.decision(4) == Decision(count=3)
    assert board.latest_round() == 4 and failed_over(board, 4)
    assert board.verdict(3) == before
    assert server.data[KEYS.fate(4, 0)].startswith(b"lost:a")  # the first survivor settled it
    (record,) = board.failures()  # told once
    assert record["kind"] == "node_lost" and record["node_rank"] == 0
    assert "served the store and was lost" in str(record["reason"])
    (about, event) = board.event(4, 1) or ("", None)
    assert about == "h" and event is not None and event.node_rank == 0
    assert board.counter(KEYS.round(4, "settled")) == 1  # the survivors settle themselves


def test_a_failover_moves_the_survivor_and_says_where() -> None:
    lost = Candidate("10.0.0.1", 29400, 0)
    places = Places(lost, me=1)
    failover = Failover(places, RendezvousSettings())
    move = failover.move(KEYS, "a", ROUND, 1, "no answer", 1.0, None)
    assert move is not None and move.reach is None  # it serves: nobody to reach
    assert failover.epoch == 1 and places.current == move.candidate
    said = failover.take()
    assert said is not None and said["lost_node"] == 0 and said["successor_node"] == 1
    assert said["lost_host"] == "node 0 (n0, 10.0.0.1)" and said["epoch"] == 1
    assert failover.take() is None  # once
    # the other survivor finds it there, one failover past its own store
    other = Places(lost, me=2)
    other.serving = places.serving
    found = Failover(other, RendezvousSettings()).move(KEYS, "b", ROUND, 2, "x", 1.0, None)
    assert found is not None and found.candidate == move.candidate and found.reach is not None


def test_the_old_host_finds_it_was_superseded() -> None:
    lost = Candidate("10.0.0.1", 29400, 0)
    places = Places(lost, me=0)
    assert superseded(_candidates(places), places, 0, 0, KEYS, 1, clock=Clock()) is None
    newer = places.serving[Candidate("10.0.0.3", 29400, 2)] = MemoryServer()
    newer.data[KEYS.epoch] = b"1"
    found = superseded(_candidates(places), places, 0, 0, KEYS, 1, clock=Clock())
    assert found == Candidate("10.0.0.3", 29400, 2)
    # No round formed there yet (a member cut off like this host may serve it): not a reason
    # to give up; once one formed there (``confirmed``), it is.
    quick = RendezvousSettings(heartbeat_interval=0.1, heartbeat_timeout=0.3)
    assert Failover(places, quick).superseded(KEYS, ROUND, 0) is None
    newer.data[KEYS.confirmed] = b'{"epoch": 1, "round": 5}'
    why = Failover(places, quick).superseded(KEYS, ROUND, 0)
    assert why is not None and why.startswith("superseded: ") and "node 2 (n2, 10.0.0.3)" in why
    assert why.endswith("is out of the job, which goes on there without it (exit 79)"), why


def test_a_lost_store_back_just_now_is_passed_by_when_the_next_one_serves() -> None:
    """The host was frozen and answers again while this survivor tries it, but another
    survivor already serves the next store: this one goes there, not back."""
    lost = Candidate("10.0.0.1", 29400, 0)
    successor = Candidate("10.0.0.2", 29400, 1)
    places = Places(lost, me=2)
    places.serving[lost] = MemoryServer()
    places.serving[successor] = MemoryServer()
    places.serving[successor].data[KEYS.epoch] = b"1"
    found = walk(_candidates(places), places, 2, 1, KEYS, patience=3, clock=Clock())
    assert found is not None and found[0] == successor and not found[2]


def test_a_place_no_member_is_at_gets_one_try_not_the_patience() -> None:
    """Listed endpoints, the spare's place before this survivor's: nobody will serve there
    (a spare never does), so the walk does not wait for it and serves at its own place."""
    lost = Candidate("10.0.0.1", 29400, 0)
    spare, me = Candidate("10.0.0.9", 29400), Candidate("10.0.0.2", 29400, 1)
    places = Places(lost, me=1)
    found = walk([lost, spare, me], places, 1, 1, KEYS, patience=30, clock=Clock(), idle=[spare])
    assert found is not None and found[0] == me and found[2]
    assert places.tries.count(spare) == 1
    places = Places(lost, me=1)  # not idle: tried for the patience (each look costs 0.5 s)
    found = walk([lost, spare, me], places, 1, 1, KEYS, patience=3, clock=Clock())
    assert found is not None and places.tries.count(spare) > 1


def test_c10d_candidates_listed_or_the_members_in_node_rank_order() -> None:
    from phalanx.rendezvous.backends.c10d import check
    from phalanx.rendezvous.backends.successor import AgentStoreSuccessors
    from phalanx.rendezvous.spec import RendezvousSpec

    members = AgentStoreSuccessors([("10.0.0.1", 29400)], Token(), "job", RendezvousSettings())
    assert members.candidates(ROUND) == [Candidate(f"10.0.0.{r + 1}", 29400, r) for r in range(3)]
    assert members.store_host(ROUND) == 0 and members.is_current(Candidate("10.0.0.1", 29400, 0))
    assert not members.is_current(Candidate("10.0.0.1", 29401))
    spec = RendezvousSpec("c10d", "job", 2, 3, "10.0.0.3:7,10.0.0.1,10.0.0.2:9")
    options, problems = check(spec)
    assert problems == [] and options is not None
    assert options.endpoints == (("10.0.0.3", 7), ("10.0.0.1", 29400), ("10.0.0.2", 9))
    listed = AgentStoreSuccessors(options.endpoints, Token(), "job", RendezvousSettings())
    assert [str(c) for c in listed.candidates(ROUND)] == [
        "10.0.0.3:7",
        "10.0.0.1:29400",
        "10.0.0.2:9",
    ]
    assert listed.store_host(ROUND) == 2  # the member at the first endpoint's address
    # A place a member is at (its address, or its host name as written), or a spare's
    assert all(members.at_member(c, ROUND) for c in members.candidates(ROUND))
    assert listed.at_member(Candidate("10.0.0.2", 9), ROUND)
    assert listed.at_member(Candidate("n1", 9), ROUND)  # node 1's host name
    assert not listed.at_member(Candidate("10.0.0.4", 9), ROUND)  # no member: a spare's
    _, problems = check(RendezvousSpec("c10d", "job", 2, 3, "a:1,b:x"))
    assert problems and "port" in problems[0]
