"""Rendezvous tier (b): liveness by leases (the etcd way), on the in-memory store with leases.

A "crashed" node is one whose store handle is closed: its leased key vanishes ``LEASE_TTL``
seconds later, as etcd expires the lease of a process that stopped renewing it. The
heartbeat timeout is set far beyond every wait here, so each lost node below can only have
been found through its lease.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from phalanx.errors import RendezvousError
from phalanx.rendezvous.api import EventKind
from phalanx.rendezvous.dynamic.board import LEFT
from phalanx.rendezvous.dynamic.handler import DynamicRendezvous
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.pulse import ALIVE
from phalanx.rendezvous.stores.base import LeasedStore
from support.launch import wait_for
from support.memcluster import FAST, WAIT, Join, agreed, crash, form, rounds, wait_event
from support.memory_store import LeasedMemoryStore, MemoryServer, MemoryStore

LEASE_TTL = 1.0
SETTINGS = replace(FAST, heartbeat_timeout=10 * WAIT)  # counters would never find anyone lost


class LeasedCluster:
    def __init__(self) -> None:
        self.server = MemoryServer()
        self.handlers: list[DynamicRendezvous] = []
        self.stores: dict[str, LeasedMemoryStore] = {}

    def node(self, name: str, nnodes: tuple[int, int] = (2, 2)) -> DynamicRendezvous:
        store = LeasedMemoryStore(self.server, lease_ttl=LEASE_TTL)
        self.stores[name] = store
        handler = DynamicRendezvous(
            store,
            run_id="job",
            min_nodes=nnodes[0],
            max_nodes=nnodes[1],
            addr=f"addr-{name}",
            hostname=name,
            settings=SETTINGS,
        )
        self.handlers.append(handler)
        return handler

    def liveness_key(self, handler: DynamicRendezvous) -> str:
        return Keys("job").heartbeat(handler.node_id)


@pytest.fixture
def cluster() -> Iterator[LeasedCluster]:
    c = LeasedCluster()
    try:
        yield c
    finally:
        for handler in c.handlers:
            handler.shutdown()


def test_only_stores_with_leases_get_leased_keys(cluster: LeasedCluster) -> None:
    assert isinstance(LeasedMemoryStore(cluster.server, lease_ttl=1), LeasedStore)
    assert not isinstance(MemoryStore(cluster.server), LeasedStore)
    a, b = cluster.node("a"), cluster.node("b")
    form(a, b)
    for name, handler in (("a", a), ("b", b)):
        key = cluster.liveness_key(handler)
        # written once, bound to the node's own lease; no counter is bumped on top of it
        wait_for(
            lambda key=key: cluster.server.data.get(key) == ALIVE,
            WAIT,
            "the node's alive key",
            every=0.02,
        )
        assert cluster.server.leased[key] == cluster.stores[name].lease


def test_crashed_node_is_lost_when_its_lease_expires(cluster: LeasedCluster) -> None:
    a, b = cluster.node("a", (1, 2)), cluster.node("b", (1, 2))
    at_a, _ = rounds(a, b)
    crash(b)
    event = wait_event(a, EventKind.NODE_LOST)
    assert "lost its lease" in event.detail and "(b, addr-b, node id " in event.detail
    assert at_a.claim_restart(1)
    alone = Join(a).result()  # b's fate is settled as lost: the round forms without it
    assert (alone.num_nodes, alone.restart_count, alone.node_rank) == (1, 1, 0)


def test_lost_node_with_too_few_left_ends_the_job(cluster: LeasedCluster) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    at_a, _ = rounds(a, b)
    crash(b)
    wait_event(a, EventKind.NODE_LOST)
    assert at_a.claim_restart(1)
    with pytest.raises(RendezvousError, match=r"only 1 node.*at least 2 needed"):
        Join(a).result()


def test_node_whose_lease_lapsed_learns_it_and_is_lost_for_the_others(
    cluster: LeasedCluster,
) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    _, rb = form(a, b)
    cluster.server.expire(cluster.stores["b"].lease)  # b lives on, but its lease is gone
    assert "lease" in wait_event(b, EventKind.STORE_LOST).detail
    assert wait_event(a, EventKind.NODE_LOST).node_rank == rb.node_rank
    with pytest.raises(RendezvousError, match="lease"):
        Join(b).result()


def test_leaving_on_purpose_outlives_the_lease(cluster: LeasedCluster) -> None:
    a, b, c = (cluster.node(n, (2, 3)) for n in "abc")
    joined = rounds(a, b, c)
    agreed([r.result for r in joined])
    c.shutdown()  # a graceful scale-down: c says so itself, then its lease ends
    event = wait_event(a, EventKind.NODE_LOST)
    assert "left the job" in event.detail
    key = cluster.liveness_key(c)
    # LEFT was a plain write: the lease no longer owns the key, so its expiry keeps it
    wait_for(
        lambda: cluster.stores["c"].lease not in cluster.server.leases_alive,
        WAIT,
        "c's lease to expire",
        every=0.02,
    )
    assert cluster.server.data[key] == LEFT
    for r in joined[:2]:
        assert r.claim_restart(1)
    results = form(a, b)
    agreed(results)
    assert results[0].num_nodes == 2
