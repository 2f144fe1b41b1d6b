"""Rendezvous tier (b): the algorithm, with simulated agents in threads on an in-memory store
(``memcluster``)."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from typing import ClassVar

import pytest

from phalanx.errors import RendezvousError
from phalanx.rendezvous.api import EventKind, NodeInfo
from phalanx.rendezvous.dynamic.board import LEFT, Board
from phalanx.rendezvous.dynamic.formation import RoundFormer
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.members import Arrival, Membership
from phalanx.rendezvous.dynamic.queued import QueuedNodes, restart_close
from phalanx.rendezvous.dynamic.records import parsed
from phalanx.rendezvous.stores.base import MalformedValue
from support.launch import wait_for
from support.memcluster import (
    FAST,
    WAIT,
    Cluster,
    Join,
    agreed,
    crash,
    form,
    rounds,
    swept,
    wait_event,
)
from support.memory_store import MemoryServer, MemoryStore


def test_two_nodes_agree(cluster: Cluster) -> None:
    results = form(cluster.node("a"), cluster.node("b"))
    agreed(results)
    assert results[0].world_size == 4 and results[0].round == 0
    assert {r.this_node.hostname for r in results} == {"a", "b"}
    assert results[0].rank_offset + results[1].rank_offset == 2


def test_max_present_starts_without_last_call(cluster: Cluster) -> None:
    slow = replace(FAST, last_call_timeout=600)  # the round would hang if it waited for it
    nodes = [cluster.node(n, nnodes=(1, 3), settings=slow) for n in "abc"]
    agreed(form(*nodes))


def test_between_min_and_max_waits_the_last_call(cluster: Cluster) -> None:
    window = replace(FAST, last_call_timeout=8)
    a, b, c = (cluster.node(n, nnodes=(2, 4), settings=window) for n in "abc")
    first = [Join(a), Join(b)]
    wait_for(
        lambda: cluster.server.data.get("phalanx/rdzv/job/r0/joined") == b"2",
        WAIT,
        "two nodes joined",
        every=0.02,
    )
    late = Join(c)  # inside the window: it makes the round, which still closes below MAX
    results = [j.result() for j in [*first, late]]
    agreed(results)
    assert results[0].num_nodes == 3


def test_late_joiner_waits_then_is_admitted(cluster: Cluster) -> None:
    a, b = cluster.node("a", nnodes=(2, 3)), cluster.node("b", nnodes=(2, 3))
    before = form(a, b)
    c = cluster.node("c", nnodes=(2, 3))
    late = Join(c)
    for h in (a, b):
        event = wait_event(h, EventKind.NODE_WAITING)
        assert "node c" in event.detail
    assert not late.done()
    after = [*form(a, b), late.result()]
    agreed(after)
    assert after[0].round == 1 and after[0].num_nodes == 3
    assert after[0].restart_count == 0  # a scale-up does not spend the budget
    assert [r.node_rank for r in after[:2]] == [r.node_rank for r in before]  # stable
    assert after[2].node_rank == 2


def test_full_job_keeps_a_spare_without_restarting(cluster: Cluster) -> None:
    a, b = cluster.node("a", nnodes=(1, 2)), cluster.node("b", nnodes=(1, 2))
    form(a, b)
    spare = Join(cluster.node("c", nnodes=(1, 2)))
    time.sleep(1.0)  # time for a (wrong) NODE_WAITING to arrive
    assert a.poll() is None and b.poll() is None  # MAX reached: nobody is told to restart
    crash(b)
    wait_event(a, EventKind.NODE_LOST)
    results = [Join(a).result(), spare.result()]
    agreed(results)
    assert {r.this_node.hostname for r in results} == {"a", "c"}


@pytest.mark.parametrize("lost", [1, 2])
def test_lost_node_then_rendezvous_with_the_rest(cluster: Cluster, lost: int) -> None:
    nodes = [cluster.node(n, nnodes=(2, 3)) for n in "abc"]
    before = {r.this_node.hostname: r.node_rank for r in form(*nodes)}
    by_rank = sorted(nodes, key=lambda h: before[h._hostname])
    crash(by_rank[lost])
    survivors = [h for h in by_rank if h is not by_rank[lost]]
    for h in survivors:
        assert wait_event(h, EventKind.NODE_LOST).node_rank == lost
    after = form(*survivors)
    agreed(after)
    assert after[0].num_nodes == 2 and after[0].round == 1
    assert after[0].node_rank == 0  # node 0 keeps rank 0
    if lost == 2:
        assert after[1].node_rank == 1  # nothing had to move


def test_too_few_nodes_left_is_an_error(cluster: Cluster) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    form(a, b)
    crash(b)
    wait_event(a, EventKind.NODE_LOST)
    with pytest.raises(RendezvousError, match=r"only 1 node.*at least 2 needed"):
        Join(a).result()


def test_join_timeout_is_an_error(cluster: Cluster) -> None:
    lonely = cluster.node("a", settings=replace(FAST, join_timeout=1))
    with pytest.raises(RendezvousError, match="join_timeout=1s"):
        Join(lonely).result()


def test_two_run_ids_on_one_store_never_mix(cluster: Cluster) -> None:
    one = [cluster.node(f"one-{i}", run_id="one") for i in range(2)]
    two = [cluster.node(f"two-{i}", run_id="two") for i in range(2)]
    joins = [Join(h) for h in one + two]
    joined = [j.joined() for j in joins]
    results = [r.result for r in joined]
    agreed(results[:2])
    agreed(results[2:])
    assert {n.hostname for n in results[0].nodes} == {"one-0", "one-1"}
    assert {n.hostname for n in results[2].nodes} == {"two-0", "two-1"}
    joined[0].report_failure({"rank": 0, "exit_code": 1})
    wait_event(one[1], EventKind.PEER_FAILED)
    time.sleep(0.5)
    assert two[0].poll() is None and two[1].poll() is None
    assert two[0].failures() == []


def test_failure_reaches_every_node_and_restarts_are_job_wide(cluster: Cluster) -> None:
    nodes = [cluster.node(n, nnodes=(3, 3)) for n in "abc"]
    joined = rounds(*nodes)
    for budget_left in (True, False):
        joined[0].report_failure({"rank": 0, "exit_code": 3})
        for h in nodes[1:]:
            event = wait_event(h, EventKind.PEER_FAILED)
            assert event.failure == {"rank": 0, "exit_code": 3}
        # every node asks, with different budgets: the first claim decides for all
        claims = [r.claim_restart(1 + i) for i, r in enumerate(joined)]
        assert len(set(claims)) == 1 and claims[0] is budget_left
        if budget_left:
            joined = rounds(*nodes)
            results = [r.result for r in joined]
            agreed(results)
            assert results[0].restart_count == 1
    assert [f["exit_code"] for f in nodes[2].failures()] == [3, 3]
    assert [f["round"] for f in nodes[2].failures()] == [0, 1]


def test_job_stopped_reaches_everyone(cluster: Cluster) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    form(a, b)
    a.report_done(False)
    wait_event(b, EventKind.JOB_STOPPED)
    with pytest.raises(RendezvousError, match="stopped"):
        Join(b).result()


def test_store_host_lost_means_store_lost_not_a_hang(cluster: Cluster) -> None:
    host, other = cluster.node("a", hosting=True), cluster.node("b")
    form(host, other)
    host._store.close()  # the hosting agent is gone, and its store with it
    assert "unreachable" in (wait_event(other, EventKind.STORE_LOST).detail)
    with pytest.raises(RendezvousError):
        Join(other).result()


def test_member_still_stopping_is_waited_for(cluster: Cluster) -> None:
    a, b = cluster.node("a", nnodes=(1, 2)), cluster.node("b", nnodes=(1, 2))
    form(a, b)
    early = Join(a)
    time.sleep(3 * FAST.last_call_timeout)  # b is alive but busy: a must not start alone
    assert not early.done()
    results = [Join(b).result(), early.result()]
    agreed(results)
    assert results[0].num_nodes == 2


def test_static_ranks_are_the_given_ones(cluster: Cluster) -> None:
    nodes = [
        cluster.node(n, nnodes=(3, 3), fixed_rank=r) for n, r in [("x", 2), ("y", 0), ("z", 1)]
    ]
    joined = rounds(*nodes)
    results = [r.result for r in joined]
    agreed(results)
    assert [r.node_rank for r in results] == [2, 0, 1]
    assert results[0].master_addr == "addr-y"
    joined[0].report_failure({"rank": 5, "exit_code": 1})
    for h in nodes[1:]:
        wait_event(h, EventKind.PEER_FAILED)
    assert all(r.claim_restart(2) for r in joined)
    again = form(*nodes)
    assert [r.node_rank for r in again] == [2, 0, 1] and again[0].restart_count == 1


def test_static_duplicate_rank_fails_everywhere(cluster: Cluster) -> None:
    nodes = [cluster.node(n, fixed_rank=1) for n in "xy"]
    joins = [Join(h) for h in nodes]
    for j in joins:
        with pytest.raises(RendezvousError, match="--node-rank 1 was given to more than one"):
            j.result()


def test_exit_barrier_waits_for_every_node(cluster: Cluster) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    _, at_b = rounds(a, b)
    a.report_done(True)
    leaving = threading.Thread(target=a.shutdown)
    leaving.start()
    time.sleep(0.5)
    assert leaving.is_alive()  # still waiting for b, so a's store would stay up
    b.report_done(True)
    leaving.join(WAIT)
    assert not leaving.is_alive()
    # b's exit barrier: None at once (every member ok), not after exit_barrier_timeout
    began = time.monotonic()
    assert at_b.await_peers() is None
    assert time.monotonic() - began < FAST.exit_barrier_timeout


def test_no_restart_once_a_node_finished_and_it_learns_the_job_failed(cluster: Cluster) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    at_a, at_b = rounds(a, b)
    a.report_done(True)  # a's workers finished
    at_b.report_failure({"rank": 1, "exit_code": 5})
    assert at_b.claim_restart(3) is False  # a's workers would not run again
    event = at_a.await_peers()
    assert event is not None and event.kind is EventKind.PEER_FAILED
    assert at_a.await_peers() == event  # the answer is kept
    b.report_done(False)
    assert a.failures()[0]["exit_code"] == 5


def test_a_node_that_finished_stops_a_restart_claimed_before(cluster: Cluster) -> None:
    """The other order: b claims the restart before a marks itself finished; a, which will
    not run again, stops the job, so b's next round fails at once instead of waiting."""
    a, b = cluster.node("a"), cluster.node("b")
    at_a, at_b = rounds(a, b)
    at_b.report_failure({"rank": 1, "exit_code": 5})
    assert at_b.claim_restart(3) is True
    rejoin = Join(b)
    a.report_done(True)
    event = at_a.await_peers()
    assert event is not None and event.kind is EventKind.PEER_FAILED
    a.report_done(False)
    with pytest.raises(RendezvousError, match="the job stopped"):
        rejoin.result()


def test_the_store_host_leaves_last(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """After a success the node serving the store closes it only once every peer has seen the
    barrier and said it is leaving, so no peer's last read meets a closed store."""
    host, peer = cluster.node("a", hosting=True), cluster.node("b")
    form(host, peer)
    host.report_done(True)
    peer.report_done(True)
    leaving = threading.Thread(target=host.shutdown)
    leaving.start()
    time.sleep(0.5)
    assert leaving.is_alive()  # all_ok is there, but b has not said it left
    with caplog.at_level(logging.INFO, logger="phalanx"):
        peer.shutdown()  # reads all_ok: with the store closed it would warn and leave
        leaving.join(WAIT)
    assert not leaving.is_alive()
    assert "not every node finished" not in caplog.text
    assert "did not confirm" not in caplog.text


def test_event_behind_a_dead_writers_hole_still_arrives(cluster: Cluster) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    _, at_b = rounds(a, b)
    dead_writer = MemoryStore(cluster.server)
    dead_writer.add("phalanx/rdzv/job/r0/events", 1)  # took slot 1, died before writing it
    at_b.report_failure({"rank": 2, "exit_code": 9})  # lands in slot 2
    assert wait_event(a, EventKind.PEER_FAILED).failure == {"rank": 2, "exit_code": 9}


# restart_close(joined, survivors, queued, live, (MIN, MAX), last_call_over) -> count | 0 | None
RESTART_CLOSE = [
    ((1, 1, 1, 1, (2, 2), False), None),  # the spare is expected: the last call runs
    ((2, 1, 1, 1, (2, 2), False), 2),  # everyone expected is in: at once
    ((1, 1, 1, 1, (2, 2), True), None),  # a frozen spare that still beats: waited for
    ((1, 1, 1, 0, (2, 2), True), 0),  # the spare is lost: too few, the round fails
    ((1, 1, 0, 0, (2, 2), True), 0),  # no spare at all: as before
    ((2, 1, 2, 2, (2, 3), True), None),  # MIN in, a second live spare has a place: waited for
    ((2, 1, 2, 1, (2, 3), True), 2),  # MIN in, the other spare lost: runs with 2
    ((3, 2, 3, 3, (2, 3), True), 3),  # MAX in: queued spares beyond it are not waited for
    ((2, 2, 3, 3, (1, 2), True), 2),  # survivors fill MAX: no spare is needed
    ((1, 1, 2, 1, (1, 3), True), None),  # one live spare of two: the round waits for it
]


@pytest.mark.parametrize(("args", "closes"), RESTART_CLOSE)
def test_restart_round_closes_as_the_rule_says(
    args: tuple[int, int, int, int, tuple[int, int], bool], closes: int | None
) -> None:
    assert restart_close(*args) == closes


def test_a_queued_node_is_live_until_its_heartbeat_is_heartbeat_timeout_old() -> None:
    """Judged on this node's clock from its first look (no clock sync); a place taken whose
    id never came is live as long; ``LEFT`` is not live."""
    now = [100.0]
    board = Board(MemoryStore(MemoryServer()), Keys("job"), "me")
    queue = QueuedNodes(board, FAST, clock=lambda: now[0])
    for spare in ("s1", "s2"):
        queue.record(1, spare)
        board.store.set(board.keys.heartbeat(spare), b"1")
    board.store.add(board.keys.round(1, "waiting"), 1)  # a third place, its id never written
    assert queue.count(1) == 3 and queue.live(1, 3) == 3
    now[0] += FAST.heartbeat_timeout - 0.1
    board.store.set(board.keys.heartbeat("s2"), b"2")  # s2 beats again; s1 stays frozen
    assert queue.live(1, 3) == 3
    now[0] += 0.2
    assert queue.live(1, 3) == 1  # s1 and the hole are lost
    board.store.set(board.keys.heartbeat("s2"), LEFT)
    assert queue.live(1, 3) == 0


class _SlowClose(MemoryStore):
    """A handle whose proposals to close a round take a while (as under load): whoever is
    woken meanwhile finds the round undecided."""

    proposals: ClassVar[list[str]] = []

    def compare_set(
        self, key: str, expected: bytes | None, desired: bytes
    ) -> tuple[bool, bytes | None]:
        if key.endswith("/closed"):
            self.proposals.append(key)
            time.sleep(0.3)
        return super().compare_set(key, expected, desired)


def test_a_full_restart_round_is_closed_once_by_its_last_arrival() -> None:
    """The MAX-th arrival of a restart round closes it before it settles its place in the
    round before: its settle is the last and wakes every member that rejoined, which would
    each propose the close themselves if they found the round undecided."""
    server = MemoryServer()
    keys = Keys("job")
    boards = [Board(_SlowClose(server), keys, f"node-{i}") for i in range(3)]
    formers = [RoundFormer(b, FAST, 3, 3) for b in boards]
    arrivals = [Arrival(b.node_id, f"host{i}", "127.0.0.1", 1) for i, b in enumerate(boards)]
    with ThreadPoolExecutor(3) as pool:
        first = list(pool.map(lambda i: formers[i].form(arrivals[i], None, None), range(3)))
        _SlowClose.proposals.clear()
        # Two rejoin and wait for the round before to settle; then the third, the MAX-th.
        early = [pool.submit(formers[i].form, arrivals[i], *first[i][:2]) for i in (0, 1)]
        wait_for(lambda: server.data.get(keys.round(1, "joined")) == b"2", WAIT, "two rejoined")
        last = formers[2].form(arrivals[2], *first[2][:2])
        again = [f.result(WAIT) for f in early] + [last]
    assert {m.round for m, _, _ in again} == {1}
    assert _SlowClose.proposals == [keys.round(1, "closed")]


def test_a_membership_is_written_as_lists_and_read_in_both_forms() -> None:
    """Every node reads the membership each round: it is stored as a list per field (half
    the bytes of an object per node at 1,024 nodes); the object form is still read, and
    lists of different lengths are a malformed value, not a shorter membership."""
    nodes = tuple(NodeInfo(rank, f"host{rank}", f"10.0.0.{rank}", 8) for rank in range(3))
    members = Membership(2, 1, ("a", "b", "c"), nodes, ({"code": "x"}, {}, {}))
    body = members.to_json()
    assert body["hostnames"] == ["host0", "host1", "host2"] and "nodes" not in body
    assert Membership.from_json(body) == members
    objects = {k: v for k, v in body.items() if k not in ("ranks", "hostnames", "addrs")}
    objects["nodes"] = [asdict(node) for node in nodes]
    assert Membership.from_json(objects) == members
    with pytest.raises(MalformedValue, match="differ in length"):
        parsed("members", {**body, "addrs": ["10.0.0.0"]}, Membership.from_json)


def test_what_a_node_that_comes_to_the_job_finds(cluster: Cluster) -> None:
    """``Peers.job_running`` (true: the agent joins once its warm start is ready): not before
    round 0 forms; once it has, also when round 0's keys are swept (two re-forms later); not
    once a restart round has its members settled and waits for nodes (here below MIN: it needs
    the newcomer); never for the store's host or a fixed rank. With real agents:
    tests/multinode/test_join_when_ready.py."""
    patient = replace(FAST, last_call_timeout=WAIT)  # the restart round waits for a node
    a, b = cluster.node("a", settings=patient), cluster.node("b", settings=patient)
    assert not a.job_running() and not b.job_running()
    for _ in range(3):  # rounds 0, 1, 2: round 2's rank 0 sweeps round 0
        form(a, b)
    swept()
    assert "phalanx/rdzv/job/r0/closed" not in cluster.server.data
    newcomer, static = cluster.node("c", settings=patient), cluster.node("s", fixed_rank=0)
    host = cluster.node("h", hosting=True)  # (last: its shutdown stops the server)
    assert newcomer.job_running()
    assert not static.job_running() and not host.job_running()
    crash(b)
    wait_event(a, EventKind.NODE_LOST)
    rejoining = Join(a)  # round 3: b found lost, one node of MIN 2 in
    wait_for(lambda: not newcomer.job_running(), WAIT, "round 3 to wait for a node")
    arriving = Join(newcomer)
    results = [rejoining.result(), arriving.result()]
    agreed(results)
    assert results[0].round == 3 and newcomer.job_running()
