"""What the c10d failover tests share (``tests/multinode/test_store_failover.py`` and
``test_member_cut_off.py``): three agents at ``--nnodes 2:3``, each in a network namespace
of its own, training a checkpointing trainer whose result does not depend on the world size
(``tests/workers/failover_train.py``); its weights after an uninterrupted run; the agents'
events."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from support.hosts import NamespaceHosts, Node
from support.launch import worker
from support.multinode import FAST, c10d_args
from support.netns import NetNamespaces

HANG = 240.0
STEPS = 40
PORT = 29400  # each namespace has its own ports
HOST = socket.gethostname()  # (a network namespace keeps the machine's name)
# All three in round 0 (the last call waits for the third), restarts to spend on the loss.
CONF = FAST.replace("last_call_timeout=1", "last_call_timeout=5")


def reference_weights(out: Path) -> bytes:
    """The trainer's weights after an uninterrupted run (one process: the same steps)."""
    subprocess.run(
        [sys.executable, worker("failover_train.py"), str(out), str(STEPS), "reference"],
        check=True, timeout=HANG,
    )  # fmt: skip
    return (out / "reference.bin").read_bytes()


def start_three(
    spaces: NetNamespaces,
    nodes: list[Node],
    tmp_path: Path,
    nnodes: str = "2:3",
    listed: bool = False,
    delay: str = "0.5",
) -> tuple[NamespaceHosts, Path]:
    """Three agents; ``listed``: the candidates named, ``--rdzv-endpoint`` n0,n1,n2."""
    hosts, shared = NamespaceHosts(spaces), tmp_path / "shared"
    shared.mkdir()
    for i in range(3):
        nodes.append(agent(hosts, i, tmp_path, nnodes, listed, delay=delay))
    return hosts, shared


def agent(
    hosts: NamespaceHosts,
    i: int,
    tmp_path: Path,
    nnodes: str,
    listed: bool,
    name: str = "",
    delay: str = "0.5",
) -> Node:
    rdzv = c10d_args(hosts, PORT, nnodes, "failover", CONF)
    if listed:
        where = rdzv.index("--rdzv-endpoint") + 1
        rdzv[where] = ",".join(f"{hosts.addr(j)}:{PORT}" for j in range(3))
    env = {"FAILOVER_STEP_DELAY": delay} if listed else {}  # time for a node to come back
    args = [*rdzv, "--max-restarts", "2",
            worker("failover_train.py"), str(tmp_path / "shared"), str(STEPS)]  # fmt: skip
    return Node(hosts, i, args, tmp_path, name, env=env)


def training(nodes: list[Node], shared: Path) -> Callable[[], bool]:
    """Training with all three nodes, a few steps in (rank 0's lines for restart 0)."""

    def check() -> bool:
        for node in nodes:
            assert node.proc.poll() is None, node.stderr[-3000:]
        steps = shared / "steps-0"
        return steps.exists() and sum("world=3" in s for s in steps.read_text().split("\n")) >= 6

    return check


def events(node: Node, kind: str) -> list[dict[str, object]]:
    found = []
    for path in node.logs.rglob("events.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == kind:
                found.append(record)
    return found
