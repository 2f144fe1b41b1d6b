"""A frozen node is found lost on a pass of the survivor's watch thread soon after etcd
deletes its leased key, not at the next heartbeat interval (``ring.RingWatch.glance``):
real etcd, two real agents on loopback, real Gloo, the node frozen whole by SIGSTOP.

``heartbeat_interval=60``: the heartbeat passes judge the ring a minute after the round
formed (and at each minute after), the passes between them every 15 s (a quarter of it).
``lease_ttl=3``: the frozen node's key goes some 3.5 s after the freeze. So the loss, found
from the lapsed lease, comes before the first heartbeat pass only when the passes between
judge the ring too; with the ring judged on heartbeat passes alone it comes after. And the
survivor's agent has the loss its own thread posted from that same pass (read back at once),
not 15 s later from the next one, as etcd wakes no waiting read when the entry is written.

Nothing else can find the node first: its ranks are frozen in place, so the survivor's rank
waits in Gloo (no peer error, no look), and no guardian speaks for a live, stopped agent.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from support.etcd_pair import node_events, start_pair
from support.etcd_server import EtcdCluster
from support.hosts import Node
from support.launch import wait_for
from support.tools import needs_etcd

pytestmark = needs_etcd

RUN_ID = "frozen-between-beats"
INTERVAL = 60.0  # heartbeat_interval: the first heartbeat pass comes this long after the round
CONF = (
    f"lease_ttl=3,request_timeout=2,heartbeat_interval={INTERVAL:g},heartbeat_timeout=120,"
    "last_call_timeout=1,join_timeout=60,exit_barrier_timeout=30"
)
HANG = 150.0
LEASE_LOST = "lost its lease on the rendezvous store"  # ``pulse.Leases.judge``'s reason


@pytest.fixture
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=1) as cluster:
        yield cluster


def _tree(pid: int) -> list[psutil.Process]:
    """The agent and every process under it (guardian, template, workers)."""
    return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]


def _signal(procs: list[psutil.Process], sig: signal.Signals) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)


def test_a_frozen_nodes_lapsed_lease_is_found_before_the_next_heartbeat_pass(
    etcd: EtcdCluster, nodes: list[Node], tmp_path: Path
) -> None:
    start_pair(etcd, nodes, tmp_path, nnodes="2:2", run_id=RUN_ID, conf=CONF, timeout=HANG)
    survivor, frozen = nodes
    tree = _tree(frozen.proc.pid)
    _signal(tree, signal.SIGSTOP)
    try:

        def failed() -> bool:
            return any(e["kind"] == "failure" for e in node_events(survivor))

        wait_for(failed, HANG, "the survivor to find the frozen node lost")
    finally:
        _signal(tree, signal.SIGCONT)
    events = node_events(survivor)
    failure = next(e for e in events if e["kind"] == "failure")
    assert failure["failure_kind"] == "node_lost", failure
    assert LEASE_LOST in str(failure["reason"]), failure
    [formed] = [e for e in events if e["kind"] == "rdzv_done" and e["round"] == failure["round"]]
    # The order, on the survivor's one clock: the loss before its first heartbeat pass.
    first_heartbeat_pass = float(str(formed["t"])) + INTERVAL
    assert float(str(failure["t"])) < first_heartbeat_pass, (formed, failure)
    # The survivor judged the node itself (two nodes: each watches the other), so its agent
    # had the loss from the pass that posted it, not from the next pass: that one comes a
    # pause of ``INTERVAL / 4`` after the loss was found (``failed_at``, the same clock); the
    # bound is half that pause, so a wall clock slewed against the pause's cannot blur it.
    half_a_pause = float(str(failure["failed_at"])) + INTERVAL / 8
    assert float(str(failure["detected_at"])) < half_a_pause, failure
