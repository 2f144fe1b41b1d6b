"""A rank on another node than rank 0 starts its script once rank 0's store listens
(``phalanx.worker.master``): torch's ``TCPStore`` client backs off for long when it comes
early (0.02 s early cost 0.44 s), which made most two-node restarts wait on it. Rank 0 here
takes 0.4 s more before its store listens; rank 1, on the other node, checks at its very
first line whether it does already. Without the wait it never did (the two nodes fork their
ranks within about 0.2 s of each other on a quiet machine).

The wait is ``PHALANX_MASTER_WAIT``, raised here from its default (1 s) to ``WAIT``: on the
loaded test machine rank 0's node once forked it, or rank 0 reached its store, more than the
default after rank 1 had started, and rank 1 went on without it (a CI run: "listening at my
start: no"), which the default allows. What is tested is that the wait waits for the store;
how long the default is is a bound of the product (see the module), not of this test."""

from __future__ import annotations

from pathlib import Path

from phalanx.resources.ports import free_port
from phalanx.worker.master import WAIT_ENV
from support.hosts import Node
from support.launch import worker
from support.multinode import c10d_args

# Bounds only a hang: rank 1 goes on once rank 0 listens, however late it is.
WAIT = 60.0


def test_the_other_nodes_ranks_start_once_rank_0s_store_listens(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    for i in (0, 1):
        args = [*c10d_args(net, port, "2"), worker("master_first.py")]
        nodes.append(Node(net, i, args, tmp_path, f"n{i}", env={WAIT_ENV: str(WAIT)}))
    assert [n.finish() for n in nodes] == [0, 0], nodes[1].stderr
    assert "[rank1]: listening at my start: yes" in nodes[1].stdout, nodes[1].stdout
    assert all("sum=2" in n.stdout for n in nodes)
