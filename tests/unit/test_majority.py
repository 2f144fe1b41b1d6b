"""No split brain where the c10d store may move (``rendezvous.dynamic.majority``), as pure
decisions and over the in-memory store: only the last round's members count toward a
restart round's quorum, a store that took over is confirmed once a round formed on it, a
node that starts joins only a confirmed store, and members lost with the store's host are
given up once their keepalive expired. The real thing (agents in network namespaces, a
member cut off serving a store of its own) is in ``tests/multinode/test_store_failover.py``."""

from __future__ import annotations

import itertools
import time

import pytest

from phalanx.errors import CUT_OFF_EXIT_CODE, CutOff, RendezvousError
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.failover import republish
from phalanx.rendezvous.dynamic.majority import (
    choose,
    close_restart,
    confirmed,
    ended,
    expire_late,
    forming,
    keepalive,
    short_of,
)
from phalanx.rendezvous.dynamic.records import decode
from support.memory_store import MemoryServer, MemoryStore
from support.rounds import KEYS, ROUND


@pytest.mark.parametrize(
    ("min_nodes", "joined", "members", "rejoined", "failed_over", "why"),
    [
        (2, 2, 3, 2, True, None),  # the two survivors of 3 on the successor's store
        (2, 2, 3, 1, True, "cut off: only 1 of the last round's 3 members"),  # + a newcomer
        (1, 3, 3, 1, True, "cut off: only 1 of the last round's 3"),  # + two newcomers
        (1, 2, 3, 1, False, "only 1 of the last round's 3 members are left on this store"),
        (1, 2, 4, 2, False, None),  # a half of 4 on the old store ...
        (1, 3, 4, 2, True, "at least 3 needed"),  # ... and never a half on a successor's
        (3, 2, 3, 2, True, "only 2 node(s) are left after round 4; at least 3 needed"),
        (3, 3, 3, 2, True, None),  # MIN counts the newcomer
        (1, 1, 2, 1, False, None),  # a job of 2 never fails over: MIN only
        (2, 2, 2, 0, True, None),
    ],
)
def test_only_the_last_rounds_members_count_toward_the_majority(
    min_nodes: int, joined: int, members: int, rejoined: int, failed_over: bool, why: str | None
) -> None:
    found = short_of(min_nodes, joined, members, rejoined, failed_over, 4)
    assert (found is None) == (why is None), found
    assert why is None or (found is not None and why in found), found


@pytest.mark.parametrize(
    ("failed_over", "rejoined", "joined"), [(True, 1, 2), (False, 1, 1), (True, 2, 3)]
)
def test_a_node_short_of_the_members_quorum_is_cut_off_not_the_job_failed(
    failed_over: bool, rejoined: int, joined: int
) -> None:
    """Whether it read the round's decision or the job's stop reason (``Board.close``'s)
    first, a node on a store short of the quorum is out of the job (exit 79), and says the
    job goes on elsewhere; any other failed round is the job's (exit 1)."""
    why = short_of(1, joined, 5 if joined == 3 else 3, rejoined, failed_over, 4)
    assert why is not None and why.startswith("cut off: only ")
    for error in (ended(why), ended("the job stopped: ...", f"round 5 failed: {why}")):
        assert isinstance(error, CutOff) and error.exit_code == CUT_OFF_EXIT_CODE == 79
        line = str(error)
        assert line.startswith(why + ": this node is out of the job, which goes on without it on "
                               "the side that reached a quorum of its members"), line  # fmt: skip
        assert line.endswith("(exit 79)"), line
    below_min = short_of(3, 2, 3, 2, True, 4)
    assert below_min is not None
    for plain in (ended(below_min), ended("x", f"round 5 failed: {below_min}"), ended("x")):
        assert type(plain) is RendezvousError and plain.exit_code == 1


@pytest.mark.parametrize("members", range(3, 8))
def test_no_two_stores_both_form_a_round_whatever_joins_them(members: int) -> None:
    """The last round's members split over the old store and two successors' (each member
    on one store), any number of newcomers on each: at most one store may form a round."""
    for old, first in itertools.product(range(members + 1), repeat=2):
        second = members - old - first
        if second < 0:
            continue
        sides = [(old, False), (first, True), (second, True)]
        formed = [
            side
            for side, (rejoined, moved) in enumerate(sides)
            if short_of(1, rejoined + 5, members, rejoined, moved, 0) is None
        ]
        assert len(formed) <= 1, (old, first, second, formed)


@pytest.mark.parametrize(
    ("seen", "chosen"),
    [
        ([], (None, False)),  # nobody serves: a job starting
        ([(0, True, False)], (0, False)),
        (
            [(0, True, False), (1, False, False)],
            (0, True),
        ),  # the successor forming, or a cut-off node's
        ([(0, True, False), (1, True, False)], (1, False)),  # the newest confirmed one
        ([(2, True, False), (1, True, False), (3, False, False)], (0, True)),
        (
            [(3, True, False), (2, False, False)],
            (0, False),
        ),  # an older unconfirmed one is no reason to wait
        ([(1, False, False)], (None, True)),  # only an unconfirmed one: never joined
        # The newest confirmed store forms a round (soak seed 4141: a restart round one node
        # short of MIN while a cut-off node served a newer store): joined at once.
        ([(1, True, True), (2, False, False)], (0, False)),
        ([(1, True, False), (2, True, True), (3, False, False)], (1, False)),
        ([(2, True, False), (1, True, True), (3, False, False)], (0, True)),  # not the newest
    ],
)
def test_a_node_that_starts_joins_the_newest_confirmed_store(
    seen: list[tuple[int, bool, bool]], chosen: tuple[int | None, bool]
) -> None:
    assert choose(seen) == chosen


@pytest.mark.parametrize(
    ("keys", "forms"),
    [
        ({}, True),  # round 0, open from the start
        ({"round": b"0", "r0/closed": b'{"n": 2}'}, False),
        ({"round": b"3", "r3/open": b"1"}, True),  # a restart round forming
        ({"round": b"3", "r3/open": b"1", "r3/closed": b'{"n": 3}'}, False),  # running
        ({"round": b"3"}, False),  # its number moved up before its open mark: not yet
    ],
)
def test_a_store_forms_a_round_while_its_newest_round_is_open_and_not_closed(
    keys: dict[str, bytes], forms: bool
) -> None:
    store = MemoryStore(MemoryServer())
    for name, value in keys.items():
        store.set(KEYS.prefix + name, value)
    assert forming(store, KEYS) is forms


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.now += seconds
        return False


@pytest.mark.parametrize(("quorate", "expired_at"), [(True, 4.0), (False, 12.0)])
def test_a_missing_members_keepalive_expires_sooner_once_a_quorum_is_here(
    quorate: bool, expired_at: float
) -> None:
    clock = Clock()
    assert not keepalive(lambda: True, lambda: quorate, 4.0, clock.wait, clock)
    assert clock.now == expired_at
    assert keepalive(lambda: clock.now < 2, lambda: True, 4.0, clock.wait, clock)  # it came


def _successor(rejoined: list[int]) -> tuple[MemoryServer, Board]:
    """The store that took over after ``ROUND`` (failover 1), its lost host (member 0)
    settled; each of ``rejoined`` came and took a slot in round 5."""
    server = MemoryServer()
    server.data[KEYS.epoch] = b"1"
    board = Board(MemoryStore(server), KEYS, "x")
    republish(board, ROUND, 0, "served the store and was lost", 1.0, None)
    for rank in rejoined:
        board.store.add(KEYS.round(5, "joined"), 1)
        board.settle(4, rank, ROUND.count, "rejoined")
    return server, board


def test_a_cut_off_members_store_forms_no_round_with_newcomers_and_stays_unconfirmed() -> None:
    server, board = _successor([2])
    board.store.add(KEYS.round(5, "joined"), 2)  # two newcomers: MAX reached
    board.settle(4, 1, ROUND.count, "lost")  # the other member never came
    decision = close_restart(board, 5, 3, (1, 3))
    assert decision.failed and decision.failure.startswith("cut off: only 1 of the last round's")
    assert not confirmed(MemoryStore(server), KEYS, 1)


def test_a_round_of_the_majority_confirms_the_store() -> None:
    server, board = _successor([1, 2])
    assert not confirmed(board.store, KEYS, 1)
    assert close_restart(board, 5, 2, (2, 3)).count == 2
    assert confirmed(MemoryStore(server), KEYS, 1)
    assert decode(server.data[KEYS.confirmed]) == {"epoch": 1, "round": 5}


def test_a_member_lost_with_the_store_host_is_given_up_once_its_keepalive_expired() -> None:
    """The store's host and member 2 lost at once: member 1 alone of 3 is no quorum, so it
    gives member 2 three keepalives, then settles it lost (told once); the round fails."""
    server, board = _successor([1])
    expire_late(board, 4, 0.05, time.monotonic)
    assert server.data[KEYS.round(4, "all_settled")] == b"1"
    assert server.data[KEYS.fate(4, 2)].startswith(b"lost:")
    lost = [f for f in board.failures() if f["node_rank"] == 2]
    assert len(lost) == 1 and "before its keepalive expired" in str(lost[0]["reason"])
    expire_late(board, 4, 0.05, time.monotonic)  # again: nothing more told
    assert len(board.failures()) == 2
    assert close_restart(board, 5, 1, (1, 3)).failed


def test_the_member_that_completes_the_quorum_confirms_the_store_before_the_round_closes() -> None:
    """At ``--nnodes 3`` the two survivors of 3 are a quorum but not MIN: the round waits for
    a third node (the spare, the lost host started again), which joins only a confirmed
    store. So the store is confirmed once the members' quorum is there, not at the close."""
    server, board = _successor([1])
    expire_late(board, 4, 0.05, time.monotonic)  # member 2 not there yet: no quorum (expired)
    assert not confirmed(MemoryStore(server), KEYS, 1)
    server, board = _successor([1, 2])
    expire_late(board, 4, 0.05, time.monotonic)
    assert confirmed(MemoryStore(server), KEYS, 1)
    assert decode(server.data[KEYS.confirmed]) == {"epoch": 1, "round": 5}
    assert board.decision(5) is None  # not closed: MIN 3 waits for one more
