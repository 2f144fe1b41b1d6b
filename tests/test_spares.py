"""Hot spares: an agent beyond ``--nnodes MAX`` waits for the next round; when a member
agent is SIGKILLed, the spare is in the next round and the job finishes with the right
result. Real agents (c10d, network namespaces), one worker each."""

from __future__ import annotations

import time
from pathlib import Path

from phalanx.net import free_port
from support.hosts import Node
from support.launch import wait_for, worker
from test_multinode import FAST, c10d_args


def test_a_waiting_spare_replaces_a_killed_member(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    net = hosts(3)  # type: ignore[operator]
    shared = tmp_path / "shared"
    shared.mkdir()
    port = free_port()
    # join_timeout 8 s, and the spare waits past it before the loss: a spare is not timed
    # out while the job runs, and it has the whole timeout again for the round it joins.
    conf = FAST.replace("join_timeout=60", "join_timeout=8")
    args = [*c10d_args(net, port, "2:2", conf=conf), "--max-restarts", "1", "--cold-start",
            worker("spare_round.py"), str(shared)]  # fmt: skip
    for i in (0, 1):
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    wait_for(lambda: (shared / "up.0").exists() and (shared / "up.1").exists(), 120, "round 0")
    spare = Node(net, 2, args, tmp_path, "spare", env={"SPARE": "1"})
    nodes.append(spare)
    wait_for(lambda: "is running without this node" in spare.stderr, 60, "the spare waiting")
    time.sleep(10)
    member = nodes[1]
    member.kill()  # SIGKILL of the member agent's whole session (its worker too)
    assert nodes[0].finish(timeout=180) == 0, nodes[0].stderr + spare.stderr
    assert spare.finish(timeout=60) == 0, spare.stderr
    assert "sum=3 world=2 spare" in spare.stdout, spare.stdout + spare.stderr
    assert "sum=3 world=2" in nodes[0].stdout
