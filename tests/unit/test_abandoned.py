"""A round whose every member is gone, closed by the nodes waiting for the next one
(``rendezvous.dynamic.abandoned``): the pure walk over the members' verdicts as a table, and
the check over the in-memory store with a fake clock -- members alive but slow are never
declared gone, nor are they while the store does not answer (a silence is timed afresh once
it does), two waiting nodes spend one restart between them, and with none left both end.
The real side (agents SIGKILLed or fenced, real etcd) is ``tests/rendezvous/test_all_members_gone.py``."""

from __future__ import annotations

import pytest

from phalanx.errors import RendezvousError
from phalanx.rendezvous.api import NodeInfo
from phalanx.rendezvous.dynamic.abandoned import Abandoned, gone
from phalanx.rendezvous.dynamic.board import Board, Decision
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.dynamic.pulse import Verdict
from phalanx.rendezvous.dynamic.records import encode
from phalanx.rendezvous.stores.base import StoreUnavailable
from support.memcluster import FAST
from support.memory_store import MemoryServer, MemoryStore

A, Q, L, G = Verdict.ALIVE, Verdict.QUIET, Verdict.LOST, Verdict.LEFT

# (each member's verdict in rank order, whether the round is gone, how many were judged)
WALKS = [
    ((A, L), False, 1),  # member 0 alive: it watches the rest, the walk stops there
    ((L, A), False, 2),  # one alive is enough
    ((L, L), True, 2),  # every one lost
    ((L, Q), False, 2),  # one not heard from lately but not lost: no proof, wait
    ((Q, L, L), False, 3),  # ... and the walk goes on past it, so the others are timed too
    ((G, G), False, 2),  # every one left on purpose: the job is ending, not abandoned
    ((G, L), True, 2),  # one left, the other lost: nobody is left to restart the job
]


@pytest.mark.parametrize(("verdicts", "abandoned", "judged"), WALKS)
def test_the_walk_over_the_members(
    verdicts: tuple[Verdict, ...], abandoned: bool, judged: int
) -> None:
    asked: list[str] = []

    def judge(node_id: str) -> tuple[Verdict, str]:
        asked.append(node_id)
        return verdicts[int(node_id)], "why"

    found = gone([str(i) for i in range(len(verdicts))], judge)
    assert (found is not None) == abandoned
    assert len(asked) == judged
    if found is not None:
        assert [v for v, _ in found.values()] == list(verdicts)


class _Flaky(MemoryStore):
    """A handle whose reads fail while ``down`` is set (the store out of reach)."""

    down = False

    def get(self, key: str) -> bytes | None:
        if self.down:
            raise StoreUnavailable("the store does not answer")
        return super().get(key)


class Job:
    """Round 0 running with members m0 and m1 (heartbeat counters), two nodes waiting for
    round 1, a fake clock."""

    def __init__(self, max_restarts: int = 1) -> None:
        self.now = 1000.0
        self.server = MemoryServer()
        keys = Keys("job")
        self.board = Board(MemoryStore(self.server), keys, "m0")
        nodes = tuple(NodeInfo(r, f"host{r}", f"10.0.0.{r}", 1) for r in (0, 1))
        members = Membership(0, 0, ("m0", "m1"), nodes)
        self.board.close(0, Decision(count=2))
        self.board.store.set(keys.round(0, "members"), encode(members.to_json()))
        self.beats = 0
        self.beat("m0", "m1")
        self.stores = [_Flaky(self.server) for _ in range(2)]
        self.waiting = [
            Abandoned(Board(store, keys, f"w{i}"), FAST, max_restarts, lambda: self.now)
            for i, store in enumerate(self.stores)
        ]

    def beat(self, *node_ids: str) -> None:
        self.beats += 1
        for node_id in node_ids:
            self.board.store.set(self.board.keys.heartbeat(node_id), str(self.beats).encode())

    def check(self) -> list[bool]:
        return [w.check(1, f"waiter{i}") for i, w in enumerate(self.waiting)]

    def until_quiet(self) -> None:
        """Check every heartbeat interval while no member beats, until every member has been
        looked at (each is quiet)."""
        for _ in range(10):
            assert self.check() == [False, False]
            self.now += FAST.heartbeat_interval

    def until_opened(self) -> float:
        """Check every heartbeat interval while no member beats; the fake time at which
        both waiting nodes found round 1 open (at the same check: one claim won)."""
        for _ in range(200):
            found = self.check()
            if any(found):
                assert found == [True, True]
                return self.now
            assert not self.board.is_open(1)
            self.now += FAST.heartbeat_interval
        raise AssertionError("round 1 never opened")


def test_members_alive_but_slow_are_never_declared_gone() -> None:
    """Each beats just within heartbeat_timeout (slow, alive), or one is frozen while the
    other beats: for three timeouts and more, round 1 never opens."""
    job = Job()
    step = FAST.heartbeat_timeout - 0.5
    for _ in range(4):
        assert job.check() == [False, False]
        job.now += step
        job.beat("m0", "m1")
    for _ in range(4):  # m0 frozen for good, m1 beats on
        assert job.check() == [False, False]
        job.now += step
        job.beat("m1")
    assert not job.board.is_open(1)
    assert job.board.claimed_restart(0) == (False, "")


def test_every_member_gone_opens_the_next_round_once_with_one_restart() -> None:
    job = Job()
    began = job.now  # the first look: each silence is timed from this node's look at it
    assert job.until_opened() >= began + FAST.heartbeat_timeout  # never before
    board = job.board
    assert board.is_open(1)
    restart, why = board.claimed_restart(0)
    assert restart and why.startswith("every member of round 0 is gone (2 of 2 lost;"), why
    assert "found by waiter0" in why  # the first claim decides: one restart for both
    lost = [f for f in board.failures() if f["kind"] == "node_lost"]
    assert sorted(f["node_rank"] for f in lost) == [0, 1]  # each told once, not per waiter
    assert board.store.get(board.keys.round(0, "all_settled")) is not None


def test_a_store_out_of_reach_tells_nothing_and_the_silence_is_timed_afresh() -> None:
    """The members' last beats were seen, then the store did not answer for longer than
    heartbeat_timeout: when it answers again with the same values, that is no proof the
    members were silent meanwhile (they could not write either); lost only a whole
    heartbeat_timeout after the store is back."""
    job = Job()
    job.until_quiet()
    for store in job.stores:
        store.down = True
    job.now += 3 * FAST.heartbeat_timeout
    assert job.check() == [False, False]
    for store in job.stores:
        store.down = False
    back = job.now
    assert job.until_opened() >= back + FAST.heartbeat_timeout


def test_with_no_restart_left_every_waiting_node_ends_and_no_round_opens() -> None:
    job = Job(max_restarts=0)
    job.until_quiet()
    job.now += FAST.heartbeat_timeout
    for i, waiting in enumerate(job.waiting):
        with pytest.raises(
            RendezvousError, match=r"every member of round 0 is gone.*no restart left"
        ):
            waiting.check(1, f"waiter{i}")
    assert not job.board.is_open(1)
    assert job.board.claimed_restart(0)[0] is False


def test_a_restart_round_settles_a_lost_member_whose_watchers_are_gone() -> None:
    """Round 1 is open and waits for round 0's members to settle; m1 rejoined (as a fenced
    member does, back as a new member: it watches round 0 no more) and m0 went silent, its
    guardian's word lost with the store out of reach (the c10d soak, seed 4141). The waiting
    nodes find m0 lost by the watchers' rule, once: its place settles, one ``node_lost``,
    and round 0 is all settled. A member that beats is never settled so."""
    job = Job()
    board = job.board
    board.open_round(1)
    board.settle(0, 1, 2, "rejoined")
    began = job.now
    while board.store.get(board.keys.fate(0, 0)) is None:
        assert job.now < began + 10 * FAST.heartbeat_timeout, "m0 never found lost"
        for waiting in job.waiting:
            waiting.settle_lost(0)
        job.now += FAST.heartbeat_interval
    assert job.now >= began + FAST.heartbeat_timeout  # never before its silence is that old
    assert board.store.get(board.keys.fate(0, 0)).startswith(b"lost:")  # type: ignore[union-attr]
    lost = [f for f in board.failures() if f["kind"] == "node_lost"]
    assert [f["node_rank"] for f in lost] == [0]
    assert board.store.get(board.keys.round(0, "all_settled")) is not None


def test_a_restart_round_never_settles_a_member_that_beats() -> None:
    job = Job()
    job.board.open_round(1)
    for _ in range(4 * int(FAST.heartbeat_timeout / FAST.heartbeat_interval)):
        for waiting in job.waiting:
            waiting.settle_lost(0)
        job.now += FAST.heartbeat_interval
        job.beat("m0", "m1")
    assert job.board.store.get(job.board.keys.fate(0, 0)) is None
    assert job.board.store.get(job.board.keys.fate(0, 1)) is None
