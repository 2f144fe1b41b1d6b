"""A restart round's node check runs beside its workers under ``--node-check warn`` (the
default), and the job's first round checks before its workers (docs/how-to/nodes.md, "Node
check"; ``phalanx.agent.beside``). Issue 41: every restart round that took in an agent never
checked waited 0.1-0.2 s for the check on the soak's etcd, for a verdict that only names.

Real agents, a real c10d store and Gloo, each node on a host of its own: ``--nnodes 2:2``,
node 2 a spare started once the job runs, its sending rate limited (``tc tbf``) so that its
link test, and with it round 1's check, takes seconds; node 1 SIGKILLed so that the restart
round takes the spare in. The round-1 workers wait for the test's ``go`` file, which comes
once both nodes said round 1's verdict: the order of events, never a timing. In the second
test round 1's rank 0 fails as it starts, so that round ends with its check under way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.events import read_events
from phalanx.resources.ports import free_port
from support.hosts import NamespaceHosts, Node
from support.launch import wait_for, worker
from support.linkfaults import rate_limit
from support.multinode import c10d_args
from support.netns import NetNamespaces

HANG = 120.0
FLOOR = 1 << 40  # MiB: a petabyte
ENDED = "round 1: node check stopped: its round ended before the check did"


def _events(node: Node) -> list[dict[str, Any]]:
    found = list(node.logs.glob("*/events.jsonl"))
    return read_events(found[0]) if found else []


def _seq(events: list[dict[str, Any]], kind: str, round_: int) -> int:
    (seq,) = [e["seq"] for e in events if e["kind"] == kind and e.get("round") == round_]
    return int(seq)


def _checked(node: Node, round_: int) -> bool:
    return any(e["kind"] == "node_check" and e["round"] == round_ for e in _events(node))


def _take_in_a_slow_spare(
    spaces: NetNamespaces, nodes: list[Node], tmp_path: Path, restarts: int, *worker_args: str
) -> None:
    """Round 0 on nodes 0 and 1; then the spare, node 2, its link slowed, joins, and node 1 is
    SIGKILLed: round 1 takes the spare in, with a check of seconds beside its workers."""
    net = NamespaceHosts(spaces)
    port = free_port()
    # Every run directory named (under a free-space floor no disk has): each round's lines
    # name its own nodes, so a report that holds the spare's got round 1's verdict.
    args = [*c10d_args(net, port, "2:2"), "--max-restarts", str(restarts),
            "--node-check-thresholds", f"min_free_mb={FLOOR}",
            worker("spare_round.py"), str(tmp_path), "go", *worker_args]  # fmt: skip
    nodes += [Node(net, i, args, tmp_path, f"n{i}") for i in (0, 1)]
    wait_for(lambda: (tmp_path / "up.0").exists() and (tmp_path / "up.1").exists(), 90, "round 0")
    rate_limit(spaces, 2, "1mbit")  # its link test: 4 MiB each way, cut off at 3 s
    nodes.append(Node(net, 2, args, tmp_path, "n2"))
    joined = lambda: any(e["kind"] == "rdzv_start" for e in _events(nodes[2]))  # noqa: E731
    wait_for(joined, 90, "the spare to join")
    nodes[1].kill()  # its whole session: agent, guardian, worker


def test_a_restart_round_checks_beside_its_workers_and_the_first_round_before_them(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    """Round 0 (nodes 0 and 1): ``node_check`` before ``workers_started`` on both. Round 1
    (node 0 and the spare, never checked, so every node checks): ``workers_started`` first,
    its workers up and waiting while the check runs, then ``node_check``; the job ends with
    the sum, and both reports hold round 1's lines (the spare's among them)."""
    spaces = netns(3)
    _take_in_a_slow_spare(spaces, nodes, tmp_path, restarts=1)
    survivors = (nodes[0], nodes[2])
    verdicts = lambda: all(_checked(n, 1) for n in survivors)  # noqa: E731
    wait_for(verdicts, HANG, "round 1's check to end on both nodes")
    (tmp_path / "go").touch()
    assert [n.finish(HANG) for n in survivors] == [0, 0], nodes[0].stderr + nodes[2].stderr
    assert "sum=3 world=2" in nodes[0].stdout + nodes[2].stdout, nodes[0].stdout

    first = _events(nodes[0])
    assert _seq(first, "node_check", 0) < _seq(first, "workers_started", 0), first
    for node in survivors:
        found = _events(node)
        assert _seq(found, "workers_started", 1) < _seq(found, "node_check", 1), found
        (check,) = [e for e in found if e["kind"] == "node_check" and e["round"] == 1]
        assert spaces.addr(2) in {n["addr"] for n in check["named"]}, check
        (run_dir,) = node.logs.iterdir()
        report = json.loads((run_dir / "report.json").read_text())
        assert any(spaces.addr(2) in line for line in report["node_check"]), report


def test_a_check_beside_a_round_that_ends_stops_and_the_next_round_checks_again(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    """Round 1's rank 0 exits 3 as it starts (``fail=1``), while round 1's check (the spare's
    slow link test) still runs beside the workers: on both nodes that check stops with its
    line (node 0's: its round ended) and says no verdict, and round 2 (the same two nodes;
    the spare still never checked) checks again beside its workers, whose all-reduce then
    ends the job."""
    spaces = netns(3)
    _take_in_a_slow_spare(spaces, nodes, tmp_path, 2, "fail=1")
    survivors = (nodes[0], nodes[2])
    wait_for(lambda: all(_checked(n, 2) for n in survivors), HANG, "round 2's check on both")
    (tmp_path / "go").touch()
    assert [n.finish(HANG) for n in survivors] == [0, 0], nodes[0].stderr + nodes[2].stderr
    assert "sum=3 world=2" in nodes[0].stdout + nodes[2].stdout, nodes[0].stdout

    # Node 0's round ends at its own rank's exit; the spare's check may hear of that failure
    # through the store before its round ends, and stops then, saying so.
    assert ENDED in nodes[0].stderr, nodes[0].stderr
    for node in survivors:
        found = _events(node)
        assert "round 1: node check stopped: " in node.stderr, node.stderr
        assert not _checked(node, 1), found
        assert _seq(found, "workers_started", 1) < _seq(found, "workers_started", 2), found
        assert _seq(found, "workers_started", 2) < _seq(found, "node_check", 2), found
