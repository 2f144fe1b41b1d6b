"""The node check's compute probe runs once per agent: a spare measures it before it joins a
running job, or, a spare from the job's start, while it waits; the round that takes it in
checks with the figures the nodes measured before (issue 41: the first agent SIGKILL of a soak
was back in 0.64 s against 0.16-0.38 s, 0.35 s of it that round's check, every node probing
again after the round formed; a spare from the start still probed in that round, 0.06-0.26 s).

Real agents, a real c10d store and Gloo, each node on a host of its own: ``--nnodes 2:2``,
node 2 a spare started once the job runs, node 1 SIGKILLed (agent, guardian, worker) so the
restart round takes the spare in. Round 1's workers wait for the test's ``go`` until both
nodes said round 1's check, which runs beside them (``agent.beside``). The order and count
of ``node_probe`` events -- never a timing.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from phalanx.events import read_events
from phalanx.resources.ports import free_port
from support.hosts import Node
from support.launch import wait_for, worker
from support.multinode import c10d_args


def _events(node: Node) -> list[dict[str, Any]]:
    (path,) = node.logs.glob("*/events.jsonl")
    return read_events(path)


def _kinds(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind]


def _go_once_checked(where: Path, survivors: tuple[Node, Node]) -> None:
    """Once both ``survivors`` said round 1's verdict, let its workers (``spare_round.py ... go``)
    all-reduce and end."""
    checked = lambda n: any(e["round"] == 1 for e in _kinds(_events(n), "node_check"))  # noqa: E731
    wait_for(lambda: all(checked(n) for n in survivors), 90, "round 1's check on both nodes")
    (where / "go").touch()


def _figure(check: dict[str, Any], of: dict[str, Any]) -> float:
    """The compute figure ``check`` (a ``node_check`` event) has for the node whose own
    ``node_check`` event of that round is ``of`` (its node rank then)."""
    (row,) = [row for row in check["nodes"] if row["node_rank"] == of["node"]]
    return float(row["compute"])


def test_a_spare_probes_before_it_joins_and_no_node_probes_again_when_it_is_taken_in(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """Round 0 (nodes 0 and 1) checks, each node probing once in it. The spare probes while
    the job runs, before its ``rdzv_start``. Round 1 (node 0 and the spare) checks again --
    the spare was never checked -- with no probe on either node: node 0's figure in round 1
    is its figure of round 0, the spare's the one it measured ahead."""
    net = hosts(3)  # type: ignore[operator]
    port = free_port()
    args = [*c10d_args(net, port, "2:2"), "--max-restarts", "1",
            worker("spare_round.py"), str(tmp_path), "go"]  # fmt: skip
    nodes += [Node(net, i, args, tmp_path, f"n{i}") for i in (0, 1)]
    wait_for(lambda: (tmp_path / "up.0").exists() and (tmp_path / "up.1").exists(), 90, "round 0")
    nodes.append(Node(net, 2, args, tmp_path, "n2", env={"SPARE": "1"}))
    joined = lambda: list(nodes[2].logs.glob("*/events.jsonl")) and _kinds(  # noqa: E731
        _events(nodes[2]), "rdzv_start"
    )
    wait_for(joined, 90, "the spare to join")
    nodes[1].kill()  # its whole session: agent, guardian, worker
    _go_once_checked(tmp_path, (nodes[0], nodes[2]))
    assert [nodes[0].finish(), nodes[2].finish()] == [0, 0], nodes[0].stderr + nodes[2].stderr
    assert "sum=3 world=2 spare" in nodes[2].stdout, nodes[2].stdout

    first, spare = _events(nodes[0]), _events(nodes[2])
    # Node 0: one probe, in round 0; two checks (the spare was never checked).
    assert [e["round"] for e in _kinds(first, "node_probe")] == [0], _kinds(first, "node_probe")
    checks = {e["round"]: e for e in _kinds(first, "node_check")}
    assert sorted(checks) == [0, 1], checks
    # The spare: one probe, ahead (no round), before it joined; then round 1's check.
    (probe,) = _kinds(spare, "node_probe")
    assert probe["round"] is None, probe
    assert probe["seq"] < _kinds(spare, "rdzv_start")[0]["seq"], spare
    assert [e["round"] for e in _kinds(spare, "node_check")] == [1], spare
    # Round 1's figures are the ones measured before: nobody probed after it formed.
    mine = {e["round"]: e for e in _kinds(spare, "node_check")}
    assert _figure(checks[1], checks[1]) == _figure(checks[0], checks[0]), checks
    assert _figure(checks[1], mine[1]) == probe["compute"], (checks[1], probe)


def test_a_spare_from_the_start_probes_while_it_waits_and_not_in_the_round_that_takes_it(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """Nodes 1 and 2 start together while node 0's agent (the store's host, in round 0
    alone) is SIGSTOPped, and both reach its store once it is SIGCONTed: all three join at
    the job's start (no "the job is running" wait), round 0 takes two, the third waits as
    the spare. It probes once while it waits (``node_probe``, round null, after its
    ``rdzv_start``), and not again in round 1, which takes it in when the other member is
    SIGKILLed: round 1's check has no probe on any node, and the spare's figure there is
    the one it measured while it waited."""
    net = hosts(3)  # type: ignore[operator]
    port = free_port()
    args = [*c10d_args(net, port, "2:2"), "--max-restarts", "1",
            worker("spare_round.py"), str(tmp_path), "go"]  # fmt: skip
    nodes.append(Node(net, 0, args, tmp_path, "n0"))
    wait_for(lambda: list(nodes[0].logs.glob("*/events.jsonl")) and _kinds(
        _events(nodes[0]), "rdzv_start"), 60, "node 0 to join")  # fmt: skip
    os.kill(nodes[0].proc.pid, signal.SIGSTOP)  # (its store with it: the others wait for it)
    try:
        nodes += [Node(net, i, args, tmp_path, f"n{i}") for i in (1, 2)]
        started = lambda: all(list(n.logs.glob("*/events.jsonl")) for n in nodes[1:])  # noqa: E731
        wait_for(started, 60, "nodes 1 and 2 to start")
        time.sleep(1)  # (both connect to the store: it answers them together)
    finally:
        os.kill(nodes[0].proc.pid, signal.SIGCONT)
    wait_for(lambda: (tmp_path / "up.0").exists() and (tmp_path / "up.1").exists(), 90, "round 0")
    formed = lambda n: _kinds(_events(n), "rdzv_done")  # noqa: E731
    (spare,) = [n for n in nodes[1:] if not formed(n)]
    (member,) = [n for n in nodes[1:] if n is not spare]
    wait_for(lambda: _kinds(_events(spare), "node_probe"), 60, "the spare to probe as it waits")
    member.kill()  # its whole session: agent, guardian, worker
    _go_once_checked(tmp_path, (nodes[0], spare))
    assert [nodes[0].finish(), spare.finish()] == [0, 0], nodes[0].stderr + spare.stderr
    assert "sum=3 world=2" in nodes[0].stdout + spare.stdout
    assert "the job is running" not in spare.stderr, spare.stderr  # it joined at the start

    first, mine = _events(nodes[0]), _events(spare)
    assert [e["round"] for e in _kinds(first, "node_probe")] == [0], _kinds(first, "node_probe")
    (probe,) = _kinds(mine, "node_probe")
    (start, *_) = _kinds(mine, "rdzv_start")
    (done,) = _kinds(mine, "rdzv_done")
    assert probe["round"] is None and start["seq"] < probe["seq"] < done["seq"], mine
    assert done["round"] == 1, done
    checks = {e["round"]: e for e in _kinds(first, "node_check")}
    (check,) = _kinds(mine, "node_check")
    assert sorted(checks) == [0, 1] and check["round"] == 1, (checks, check)
    assert _figure(checks[1], check) == probe["compute"], (checks[1], probe)
