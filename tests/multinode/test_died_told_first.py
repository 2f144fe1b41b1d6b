"""A node whose agent is SIGKILLed is told to the job before the ranks that failed because of
it (``rendezvous.dynamic.look``): real etcd, two real agents on loopback, real Gloo.

The survivor's rank fails with a peer's error ("Connection closed by peer") when the dead
node's rank goes. Its agent asks the ring to be judged before it posts that failure; the
dead node's guardian has said ``DIED`` in the store already, so the store's failure log
holds the loss ahead of the survivor's own record, and the survivor's failure is the node's
loss, from the guardian's word. ``heartbeat_interval=60``: the ring's own look comes a
minute after the round formed, so only the look asked for can post the loss first.

The order is made certain, not raced: the survivor's agent is stopped (SIGSTOP) before the
other agent is killed and continued once ``DIED`` is in the store and its rank has failed.
(The survivor's next round, alone, steps on: the ``nodes`` fixture ends it.)
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.rendezvous.dynamic.board import DIED, Board
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.pulse import DIED_REASON
from phalanx.rendezvous.stores.etcd.conf import EtcdOptions, run_prefix
from phalanx.rendezvous.stores.etcd.store import EtcdStore
from support.etcd_pair import node_events, start_pair
from support.etcd_server import EtcdCluster
from support.hosts import Node
from support.launch import alive, wait_for
from support.tools import needs_etcd

pytestmark = needs_etcd

RUN_ID = "told-first"
CONF = (
    "lease_ttl=120,request_timeout=4,heartbeat_interval=60,heartbeat_timeout=120,"
    "last_call_timeout=1,join_timeout=60,exit_barrier_timeout=30"
)
HANG = 120.0


@pytest.fixture
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=1) as cluster:
        yield cluster


def _failures(etcd: EtcdCluster) -> list[dict[str, object]]:
    store = EtcdStore(etcd.endpoints, run_prefix(RUN_ID), EtcdOptions())
    try:
        return Board(store, Keys(RUN_ID), "test").failures()
    finally:
        store.close()


def test_a_dead_agents_node_is_told_before_the_ranks_it_took_down(
    etcd: EtcdCluster, nodes: list[Node], tmp_path: Path
) -> None:
    both = start_pair(etcd, nodes, tmp_path, nnodes="1:2", run_id=RUN_ID, conf=CONF, timeout=HANG)
    survivor, victim = nodes
    ranks = [int(p.read_text()) for p in both]
    os.kill(survivor.proc.pid, signal.SIGSTOP)
    try:
        victim.proc.kill()
        victim.proc.wait(10)
        heartbeats = run_prefix(RUN_ID) + "kv/" + Keys(RUN_ID).heartbeat("")
        wait_for(lambda: DIED in etcd.under(heartbeats).values(), 30, "the guardian's DIED")
        wait_for(lambda: not any(alive(pid) for pid in ranks), 30, "both ranks to end")
    finally:
        os.kill(survivor.proc.pid, signal.SIGCONT)

    def failed() -> bool:
        return any(e["kind"] == "failure" for e in node_events(survivor))

    wait_for(failed, HANG, "the survivor to record the round's failure")
    [failure] = [e for e in node_events(survivor) if e["kind"] == "failure"]
    assert failure["failure_kind"] == "node_lost", failure
    assert DIED_REASON in str(failure["reason"]), failure
    records = _failures(etcd)
    [lost] = [r for r in records if r.get("kind") == "node_lost"]
    [own] = [r for r in records if r.get("peer_error")]
    assert DIED_REASON in str(lost["reason"])
    assert int(str(lost["seq"])) < int(str(own["seq"])), records
