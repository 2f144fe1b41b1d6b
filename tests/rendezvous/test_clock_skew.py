"""A host whose wall clock is wrong keeps the whole preemption grace: the deadline is timed
on each node's monotonic clock from when it heard of the preemption, never by comparing one
host's wall clock with another's (real agents, real Gloo, a real signal; the skew is an
LD_PRELOAD shim that shifts only the wall clock, ``support.skew``)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

from phalanx.errors import REQUEUE_EXIT_CODE
from phalanx.resources.ports import free_port
from support.hosts import Loopback, NamespaceHosts, Node
from support.launch import wait_for, worker
from support.skew import skewed_env

Hosts = Loopback | NamespaceHosts
FAST = "heartbeat_interval=0.5,heartbeat_timeout=4,last_call_timeout=1,join_timeout=60,exit_barrier_timeout=60"
STEPS, HOLD_AT, SAVE_SECONDS, GRACE, AHEAD = 12, 3, 4, 20, 60


def test_a_node_whose_clock_is_ahead_keeps_its_whole_grace(
    hosts: Callable[[int], Hosts], nodes: list[Node], tmp_path: Path
) -> None:
    """Node 1's wall clock runs 60 s ahead; node 0 is signalled. Node 1's rank still gets
    the grace for its 4 s save (before: node 1 counted the notice as 60 s old and stopped
    its rank at once), both ranks save the same step, both nodes exit 75."""
    net, out, port = hosts(2), tmp_path / "out", free_port()
    out.mkdir()
    skew = skewed_env(tmp_path / "skew", AHEAD)
    for i in range(2):
        args = [
            "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{net.addr(0)}:{port}", "--rdzv-id", "skew", "--rdzv-conf", FAST,
            "--preempt-signals", "SIGUSR1", "--preempt-grace", str(GRACE),
            worker("preempt_train.py"), str(out), str(STEPS), str(HOLD_AT), str(SAVE_SECONDS),
        ]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"skew{i}", env=skew if i == 1 else None))
    held = [out / f"ready_rank{r}" for r in range(2)]
    wait_for(lambda: all(p.exists() for p in held), 120, "both ranks at the held step")
    os.kill(nodes[0].proc.pid, signal.SIGUSR1)  # the node whose clock is right
    codes = [node.finish(120) for node in nodes]
    assert codes == [REQUEUE_EXIT_CODE] * 2, [n.stderr for n in nodes]
    saved = [out / f"saved_rank{r}.json" for r in range(2)]
    assert [json.loads(p.read_text()) if p.exists() else None for p in saved] == [
        {"step": HOLD_AT}
    ] * 2, [n.stderr for n in nodes]
    for node in nodes:
        (report,) = node.logs.glob("*/report.json")
        preempted = json.loads(report.read_text())["preempted"]
        assert preempted["node"] == 0 and preempted["stopped_at_deadline"] == [], preempted
