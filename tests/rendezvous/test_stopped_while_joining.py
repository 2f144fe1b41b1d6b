"""A node stopped inside ``next_round`` after the restart round closed with it as a member
(seen once in a loaded CI run: ``tests/agent/test_slow_rundir.py`` hung for its whole
pytest timeout) tells that round the job stopped, so the other member stops at once
instead of running its workers beside a peer that will never come.

Before the fix the stopped node told the round before (``JOB_STOPPED`` in round 0, whose
event log nobody reads any more) and wrote ``left`` as its heartbeat, which the other
member's ring watch passes over for good: the other member ran its restarted workers for
ever. SIGKILL at the same point is the control: the node's guardian says it died, and the
other member counts it lost.

Real agents on loopback and a real etcd, one worker per node that does not import torch.
The point is reached without any hook, by pausing agents (SIGSTOP) as the round's keys in
etcd show them get there. b's worker fails at once and b judges the round first (a's
worker ignores SIGTERM, so a's agent stops it only after ``--shutdown-timeout``); b is
paused there, so a joins the restart round alone (slot 1, node rank 0 as before) and is
paused in turn; b, let go, joins, closes the round with both, and waits for a (slot 1) to
publish the membership. That wait, the round closed with b in it, is where b is stopped;
a is let go once b is gone.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.stores.etcd.conf import run_prefix
from support.etcd_server import EtcdCluster
from support.hosts import Loopback, Node
from support.launch import wait_for, worker
from support.tools import needs_etcd

pytestmark = [pytest.mark.slow, needs_etcd]

HANG = 120.0  # bounds that only catch a hang
ENDS_WITHIN = 60.0  # a's end after it is let go: its restarted worker sleeps 300 s
GRACE = 5  # --shutdown-timeout: a's worker ignores SIGTERM, so b judges round 0 this long first
# lease_ttl 60 (fence_after 58 s): the pauses cost neither node its lease nor its fence.
# close_timeout 90: b waits in the closed round for as long as the test needs.
CONF = (
    "lease_ttl=60,request_timeout=4,heartbeat_interval=0.5,last_call_timeout=1,"
    "join_timeout=90,close_timeout=90,exit_barrier_timeout=30"
)


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=1) as cluster:
        yield cluster


def _get(etcd: EtcdCluster, run_id: str, key: str) -> bytes | None:
    """The value of the run's ``key`` in etcd now (None: absent)."""
    full = (run_prefix(run_id) + "kv/" + key).encode()
    with etcd.session() as session:
        reply = session.post(
            f"{etcd.endpoints[0]}/v3/kv/range",
            json={"key": base64.b64encode(full).decode()},
            timeout=10,
        )
    reply.raise_for_status()
    kvs = reply.json().get("kvs", [])
    return base64.b64decode(kvs[0]["value"]) if kvs else None


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_node_stopped_in_a_closed_restart_round_does_not_leave_the_other_waiting(
    etcd: EtcdCluster, nodes: list[Node], tmp_path: Path, how: signal.Signals
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    run_id = f"joinrace-{how.name.lower()}-{os.getpid()}"
    keys = Keys(run_id)
    args = [
        "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "1",
        "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoints[0].removeprefix("http://"),
        "--rdzv-id", run_id, "--rdzv-conf", CONF, "--shutdown-timeout", str(GRACE), "--cold-start",
        worker("stubborn_then_fail.py"), str(marks), "0",
    ]  # fmt: skip
    nodes.append(Node(Loopback(), 0, args, tmp_path, "a"))
    a = nodes[0]
    # a first: slot 1 and node rank 0 of round 0, so node rank 0 of the restart round too.
    wait_for(lambda: _get(etcd, run_id, keys.node(0, 1)) is not None, HANG, "a's arrival")
    nodes.append(Node(Loopback(), 1, args, tmp_path, "b"))
    b = nodes[1]
    judged = keys.round(0, "judged")
    paused: list[Node] = []
    try:
        wait_for(lambda: _get(etcd, run_id, judged) is not None, HANG, "b to judge round 0")
        os.kill(b.proc.pid, signal.SIGSTOP)
        paused.append(b)
        # (b cannot join round 1 before a judged round 0, GRACE s from now at the earliest.)
        assert _get(etcd, run_id, keys.fate(0, 1)) is None, "b was paused too late"
        wait_for(lambda: _get(etcd, run_id, keys.fate(0, 0)) is not None, HANG, "a to rejoin")
        os.kill(a.proc.pid, signal.SIGSTOP)
        paused.append(a)
        os.kill(b.proc.pid, signal.SIGCONT)
        paused.remove(b)
        # b joins, closes the round with both, and waits for a (slot 1) to assemble it.
        closed = keys.round(1, "closed")
        wait_for(lambda: _get(etcd, run_id, closed) is not None, HANG, "round 1 to close")
        assert b"n" in (_get(etcd, run_id, closed) or b""), "round 1 failed"
        assert _get(etcd, run_id, keys.round(1, "members")) is None  # b is still joining
        b.proc.send_signal(how)
        code = b.finish(HANG)
    finally:
        for node in paused:
            os.kill(node.proc.pid, signal.SIGCONT)  # a, let go once b is gone
    try:
        a_code = a.finish(ENDS_WITHIN)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a did not end after b went ({how.name}):\n{a.stderr[-3000:]}")
    if how is signal.SIGTERM:
        assert code == 128 + signal.SIGTERM, b.stderr
        assert a_code == 128 + signal.SIGTERM, a.stderr  # stopped, as b was
        assert "was stopped by SIGTERM" in a.stderr, a.stderr
        # Told in the round, at once: not found gone by its heartbeat (``ring``) 10 s later.
        assert "its heartbeat says it left" not in a.stderr, a.stderr
    else:
        assert code == -signal.SIGKILL
        assert a_code == 1, a.stderr  # b lost, and no restart left
    assert "Traceback" not in a.stderr + b.stderr
