"""A job stopped by a signal while its nodes wait in the rendezvous ends on every node as it
does on the signalled one: 143 for a stop (SIGTERM: ``phalanx stop``), 75 for a preemption,
never as a rendezvous failure (exit 1). The stop record in the store carries the signal.
Real agents on loopback (c10d), waiting for a third node that never comes."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from phalanx.errors import REQUEUE_EXIT_CODE
from phalanx.resources.ports import free_port
from support.hosts import Loopback, Node
from support.launch import wait_for, worker

HANG = 60.0
FAST = "heartbeat_interval=0.5,heartbeat_timeout=4,last_call_timeout=1,join_timeout=60"
JOB = [worker("steps_then_fail.py"), "1", "9", "0"]  # never runs: the round never forms


def _args(port: int, extra: list[str]) -> list[str]:
    return [
        "--nnodes", "3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "joining", "--rdzv-conf", FAST,
        *extra, *JOB,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("signalled", "sig", "extra", "code"),
    [
        (0, signal.SIGTERM, [], 128 + signal.SIGTERM),  # the store's host: phalanx stop
        (1, signal.SIGTERM, [], 128 + signal.SIGTERM),
        (1, signal.SIGUSR1, ["--preempt-signals", "SIGUSR1"], REQUEUE_EXIT_CODE),
    ],
    ids=["stop-the-store-host", "stop-a-client", "preempt-a-client"],
)
def test_a_signal_while_joining_ends_every_node_alike(
    signalled: int,
    sig: signal.Signals,
    extra: list[str],
    code: int,
    nodes: list[Node],
    tmp_path: Path,
) -> None:
    net, port = Loopback(), free_port()
    for i in (0, 1):
        nodes.append(Node(net, i, _args(port, extra), tmp_path, f"n{i}"))
    waiting = "phalanx: waiting for nodes: 2 of 3 present"
    wait_for(lambda: all(waiting in n.stderr for n in nodes), HANG, "both nodes to be waiting")
    nodes[signalled].proc.send_signal(sig)
    codes = [n.finish(HANG) for n in nodes]
    assert codes == [code, code], "".join(n.stderr for n in nodes)
    other = nodes[1 - signalled]
    assert "Traceback" not in other.stderr and "rendezvous error" not in other.stderr
    (report,) = other.logs.glob("*/report.json")
    data = json.loads(report.read_text())
    assert data["signal"] == sig.name, data
