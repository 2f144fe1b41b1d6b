"""The store does not grow with the rounds: old rounds are swept (``dynamic.sweep``), and a
finished or failed run on etcd leaves only its tombstone (``stopped``).

The algorithm on the in-memory store, then the same on the real agent store (counted with
``key_count``) and on a real etcd server (the run's prefix read back over etcd's API)."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator

import pytest

from phalanx.agent.crashloop import failure_signature
from phalanx.errors import RendezvousError
from phalanx.rendezvous.api import (
    EventKind,
    RendezvousHandler,
    Round,
    RoundVerdict,
    StackExchange,
)
from phalanx.rendezvous.dynamic.handler import DynamicRendezvous
from phalanx.rendezvous.registry import create_handler
from phalanx.rendezvous.spec import RendezvousSpec
from phalanx.rendezvous.stores.agentstore import AgentKVStore, StoreServer, Token
from phalanx.rendezvous.stores.etcd.conf import run_prefix
from phalanx.stragglers.watch import PHASE as RATES
from support.etcd_server import EtcdCluster
from support.memcluster import FAST, WAIT, Cluster, join_all, swept, wait_event
from support.tools import needs_etcd

ROUNDS = 20


def form_all(handlers: list[RendezvousHandler]) -> list[Round]:
    """Every handler joins the next round at once: the rounds they joined, in order, once
    node rank 0's sweep of the rounds before (in the background) ended."""
    joined = join_all(handlers)
    swept()
    return joined


def judge_all(joined: list[Round]) -> None:
    """Every node judges the round at once (the job's verdict; node 0 saw progress)."""
    verdicts: list[RoundVerdict] = []

    def judge(r: Round) -> None:
        verdicts.append(r.judge_round(r is joined[0], failure_signature))

    threads = [threading.Thread(target=judge, args=(r,)) for r in joined]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads), "judge_round hung"
    assert len(verdicts) == len(joined) and len(set(verdicts)) == 1


def stacks(joined: Round) -> StackExchange:
    exchanges = joined.exchanges()
    assert exchanges is not None
    return exchanges.stacks


def failing_round(
    handlers: list[RendezvousHandler], joined: list[Round], *, restart: bool = True
) -> None:
    """Every node posts its straggler rates (as ``stragglers.watch`` does in every round of
    several nodes), node 0 of the list fails, the rest see it, one stacks request is
    answered, every node judges the round, and every node claims the restart (with budget to
    spare)."""
    for r in joined:
        exchanges = r.exchanges()
        assert exchanges is not None
        exchanges.check.post_check(RATES, b'{"rates": {}}')
    joined[0].report_failure({"rank": 0, "exit_code": 3})
    for h in handlers[1:]:
        wait_event(h, EventKind.PEER_FAILED)  # type: ignore[arg-type]
    judge_all(joined)
    asker = joined[0]
    request = stacks(asker).request_stacks()
    for r in joined:
        stacks(r).post_stacks(request, "a stack\n")
    facts = asker.result
    ranks = list(range(facts.num_nodes))
    assert len(stacks(asker).gather_stacks(facts.round, request, ranks, WAIT)) == 2
    assert {r.claim_restart(ROUNDS + 5 if restart else 0) for r in joined} == {restart}


def restart_rounds(handlers: list[RendezvousHandler], count_keys: object) -> list[int]:
    """Form, then ``ROUNDS`` failing rounds each followed by a restart; the store's key count
    after each round forms."""
    assert callable(count_keys)
    counts = []
    joined = form_all(handlers)
    for _ in range(ROUNDS):
        failing_round(handlers, joined)
        joined = form_all(handlers)
        counts.append(int(count_keys()))
    return counts


def assert_bounded(counts: list[int]) -> None:
    """Every round does the same work and two rounds are kept, so the count stays level.
    A round of two nodes adds about 16 keys; the spread allowed is half that, for the keys a
    heartbeat thread may be writing at the moment of counting (never a round's worth)."""
    assert max(counts) - min(counts) < 8, counts


def test_restart_rounds_keep_the_memory_store_bounded(cluster: Cluster) -> None:
    nodes: list[RendezvousHandler] = [cluster.node(n) for n in "ab"]
    counts = restart_rounds(nodes, lambda: len(cluster.server.data))
    assert_bounded(counts)
    # The report still has the failing round's records (older rounds' are swept).
    assert [f["round"] for f in nodes[1].failures()][-1] == ROUNDS - 1
    assert len(nodes[1].failures()) <= 3


def test_a_sweep_missed_by_a_dead_sweeper_is_caught_up_by_the_next(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node rank 0 of round 3 dies between forming it and sweeping round 1 (the sweep is
    skipped); node rank 0 of round 4 deletes rounds 1 and 2, and the store stays level."""
    from phalanx.rendezvous.dynamic import sweep as sweep_module
    from phalanx.rendezvous.dynamic.sweep import sweep

    def sweep_unless_round_3(board: object, current: object) -> None:
        if getattr(current, "round", None) != 3:
            sweep(board, current)  # type: ignore[arg-type]

    monkeypatch.setattr(sweep_module, "sweep", sweep_unless_round_3)
    nodes: list[RendezvousHandler] = [cluster.node(n) for n in "ab"]

    def round_keys(r: int) -> list[str]:
        return [k for k in cluster.server.data if f"/r{r}/" in k]

    joined = form_all(nodes)
    counts = []
    for expected_round in range(1, 7):
        failing_round(nodes, joined)
        joined = form_all(nodes)
        counts.append(len(cluster.server.data))
        if expected_round == 3:
            assert round_keys(1), "the test's premise: round 1 was not swept"
    assert not round_keys(1) and not round_keys(2), sorted(cluster.server.data)
    assert_bounded([counts[1], *counts[3:]])  # round 3 holds the unswept round, then level


def test_restart_rounds_keep_the_real_agent_store_bounded() -> None:
    """The store c10d and static run on, over real sockets, served by the test."""
    token = Token(b"growth", "the test")
    server = StoreServer.start("127.0.0.1", 0, token)
    stores = [
        AgentKVStore(
            "127.0.0.1",
            server.port,
            token,
            read_timeout=30,
            where="the test's store",
            server=server,
        ),
        AgentKVStore.connect(
            "127.0.0.1", server.port, token=token, connect_timeout=10, read_timeout=30
        ),
    ]
    nodes: list[RendezvousHandler] = [
        DynamicRendezvous(
            s,
            run_id="tcp",
            min_nodes=2,
            max_nodes=2,
            addr="127.0.0.1",
            hostname=f"n{i}",
            settings=FAST,
        )
        for i, s in enumerate(stores)
    ]
    try:
        assert_bounded(restart_rounds(nodes, lambda: server.key_count))
    finally:
        for h in reversed(nodes):
            h.shutdown()


# -- etcd ----------------------------------------------------------------------------------
CONF = {
    "last_call_timeout": "1",
    "heartbeat_interval": "0.5",
    "heartbeat_timeout": "5",
    "lease_ttl": "3",
}


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=1) as cluster:
        yield cluster


def run_keys(cluster: EtcdCluster, run_id: str) -> list[str]:
    """Every key under the run's prefix, read straight from etcd."""
    return sorted(cluster.under(run_prefix(run_id)))


def etcd_nodes(cluster: EtcdCluster, run_id: str) -> list[RendezvousHandler]:
    spec = RendezvousSpec("etcd", run_id, 2, 2, cluster.endpoint_arg, CONF)
    return [create_handler(spec) for _ in range(2)]


@needs_etcd
def test_restart_rounds_keep_an_etcd_run_bounded(etcd: EtcdCluster) -> None:
    """On etcd a round is swept by one range delete of its prefix (``PrefixStore``): the
    count stays level, and no key of a round two behind the newest is left."""
    run_id = uuid.uuid4().hex
    nodes = etcd_nodes(etcd, run_id)
    try:
        assert_bounded(restart_rounds(nodes, lambda: len(run_keys(etcd, run_id))))
        left = {int(m[1]) for k in run_keys(etcd, run_id) if (m := re.search(r"/r(\d+)/", k))}
        assert left == {ROUNDS - 1, ROUNDS}, sorted(left)
    finally:
        for h in nodes:
            h.shutdown()


@needs_etcd
def test_a_finished_etcd_run_leaves_only_its_tombstone(etcd: EtcdCluster) -> None:
    run_id = uuid.uuid4().hex
    nodes = etcd_nodes(etcd, run_id)
    try:
        joined = form_all(nodes)
        for _ in range(3):  # rounds to sweep on the way
            failing_round(nodes, joined)
            joined = form_all(nodes)
        for h in nodes:
            h.report_done(True)
    finally:
        for h in nodes:
            h.shutdown()
    assert run_keys(etcd, run_id) == [run_prefix(run_id) + f"kv/phalanx/rdzv/{run_id}/stopped"]
    again = create_handler(RendezvousSpec("etcd", run_id, 2, 2, etcd.endpoint_arg, CONF))
    try:
        with pytest.raises(RendezvousError, match=r"finished.*give a new --rdzv-id"):
            again.next_round(1)
    finally:
        again.shutdown()


@needs_etcd
def test_an_etcd_run_whose_exit_barrier_timed_out_leaves_only_its_tombstone(
    etcd: EtcdCluster,
) -> None:
    """Node 0 finishes and gives up waiting for node 1 (``exit_barrier_timeout``); node 1
    finishes later: the run is still cleared, by node 1, the last node out."""
    run_id = uuid.uuid4().hex
    conf = {**CONF, "exit_barrier_timeout": "0.5"}
    spec = RendezvousSpec("etcd", run_id, 2, 2, etcd.endpoint_arg, conf)
    nodes = [create_handler(spec) for _ in range(2)]
    try:
        form_all(nodes)
        nodes[0].report_done(True)
        nodes[0].shutdown()  # the barrier times out: node 1 has not reported yet
        assert len(run_keys(etcd, run_id)) > 1  # node 1 is still using the run
        nodes[1].report_done(True)
    finally:
        for h in nodes:
            h.shutdown()
    assert run_keys(etcd, run_id) == [run_prefix(run_id) + f"kv/phalanx/rdzv/{run_id}/stopped"]


@needs_etcd
def test_a_failed_etcd_run_leaves_only_its_tombstone(etcd: EtcdCluster) -> None:
    run_id = uuid.uuid4().hex
    nodes = etcd_nodes(etcd, run_id)
    try:
        failing_round(nodes, form_all(nodes), restart=False)
        for h in nodes:
            h.report_done(False)
    finally:
        threads = [threading.Thread(target=h.shutdown) for h in nodes]  # they linger together
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
    assert run_keys(etcd, run_id) == [run_prefix(run_id) + f"kv/phalanx/rdzv/{run_id}/stopped"]
    again = create_handler(RendezvousSpec("etcd", run_id, 2, 2, etcd.endpoint_arg, CONF))
    try:
        with pytest.raises(RendezvousError, match=r"the job stopped.*give a new --rdzv-id"):
            again.next_round(1)
    finally:
        again.shutdown()
