"""Two real agents on loopback over one etcd, each with one Gloo rank stepping
(``tests/workers/steps_until_go.py``): the setup of the tests that watch how one node's
end reaches the other (``test_died_told_first``, ``test_frozen_found_between_beats``)."""

from __future__ import annotations

import json
from pathlib import Path

from support.etcd_server import EtcdCluster
from support.hosts import Loopback, Node
from support.launch import wait_for, worker


def start_pair(
    etcd: EtcdCluster,
    nodes: list[Node],
    tmp_path: Path,
    *,
    nnodes: str,
    run_id: str,
    conf: str,
    timeout: float,
) -> list[Path]:
    """Start both agents (appended to ``nodes``, which the caller's fixture ends) and return
    once both ranks step: each rank's ``stepping.N`` file, which holds its pid."""
    folder = tmp_path / "steps"
    folder.mkdir()
    for i in range(2):
        args = [
            "--nnodes", nnodes, "--nproc-per-node", "1", "--max-restarts", "3",
            "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoints[0].removeprefix("http://"),
            "--rdzv-id", run_id, "--rdzv-conf", conf, worker("steps_until_go.py"), str(folder),
        ]  # fmt: skip
        nodes.append(Node(Loopback(), i, args, tmp_path, f"n{i}"))
    both = [folder / "stepping.0", folder / "stepping.1"]  # rank 1: a round of both nodes
    wait_for(lambda: all(p.exists() for p in both), timeout, "both nodes' ranks to step")
    return both


def node_events(node: Node) -> list[dict[str, object]]:
    """Every event of every run of ``node``'s agent, in the order written."""
    return [
        json.loads(line)
        for path in node.logs.glob("*/events.jsonl")
        for line in path.read_text().splitlines()
    ]
