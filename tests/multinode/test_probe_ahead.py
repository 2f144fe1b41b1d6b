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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.events import read_events
from phalanx.resources.ports import free_port
from support.hosts import Loopback, NamespaceHosts, Node
from support.launch import wait_for, worker
from support.linkfaults import connected, refuse, refused
from support.multinode import c10d_args


def _events(node: Node) -> list[dict[str, Any]]:
    (path,) = node.logs.glob("*/events.jsonl")
    return read_events(path)


def _kinds(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind]


def _joined(node: Node) -> list[dict[str, Any]]:
    """``node``'s ``rdzv_start`` events (none before its events file exists)."""
    return _kinds(_events(node), "rdzv_start") if list(node.logs.glob("*/events.jsonl")) else []


def _go_once_checked(where: Path, survivors: tuple[Node, Node]) -> None:
    """Once both ``survivors`` said round 1's verdict, let its workers
    (``spare_round.py ... go``) all-reduce and end."""
    checked = lambda n: any(e["round"] == 1 for e in _kinds(_events(n), "node_check"))  # noqa: E731
    wait_for(lambda: all(checked(n) for n in survivors), 90, "round 1's check on both nodes")
    (where / "go").touch()


def _join_together(
    net: Loopback | NamespaceHosts, port: int, host: Node, start: Callable[[int], Node]
) -> list[Node]:
    """Start nodes 1 and 2 (``start(i)``) so that the store's host, node 0 (``host``), hears
    both in one go: its agent, the store with it, is SIGSTOPped while they connect.

    The stop must be short whatever the machine's load: a store host stopped past its fence
    (heartbeat_timeout - 2 s) is, when it goes on, a node no write confirmed alive, so it
    rejoins as a new member and round 0 ends unformed. On hosts of their own the two are
    refused (a reset each try: they try again every 0.25 s) until both try; only then is
    node 0 stopped and the refusal lifted, and it goes on once both are connected. On
    loopback there is nothing to refuse with: node 0 stays stopped while they start."""
    if isinstance(net, Loopback):
        os.kill(host.proc.pid, signal.SIGSTOP)
        try:
            started = [start(i) for i in (1, 2)]
            wait_for(lambda: all(list(n.logs.glob("*/events.jsonl")) for n in started), 60,
                     "nodes 1 and 2 to start")  # fmt: skip
            time.sleep(1)
        finally:
            os.kill(host.proc.pid, signal.SIGCONT)
        return started
    peers = [net.addr(i) for i in (1, 2)]
    for peer in peers:
        refuse(net, 0, port, peer, on=True)
    stopped = False
    try:
        started = [start(i) for i in (1, 2)]
        wait_for(lambda: all(refused(net, 0, port, p) for p in peers), 60, "both to try")
        os.kill(host.proc.pid, signal.SIGSTOP)
        stopped = True
        while peers:
            refuse(net, 0, port, peers.pop(), on=False)
        wait_for(lambda: _both_connected(net, port), 30, "both to connect")
    finally:
        for peer in peers:
            refuse(net, 0, port, peer, on=False)
        if stopped:
            os.kill(host.proc.pid, signal.SIGCONT)
    return started


def _a_spare_from_the_start(
    net: Loopback | NamespaceHosts, nodes: list[Node], tmp_path: Path
) -> tuple[Node, Node, Node, Path]:
    """Nodes 0, 1 and 2 of a ``2:2`` job that all joined at its start: node 0 first, then 1
    and 2 together (``_join_together``). Returns node 0, the member and the spare among 1
    and 2, and the directory their workers use.

    Joining together is a race the test sets up, not the behaviour it checks. Each of the
    two first reads whether the job runs; one that reads it only after the other joined,
    and so closed round 0 (a few store round trips), comes as to a running job and probes
    before it joins. Its odds are kept low -- the three agents run at a higher priority
    than the machine's other work (``_ahead``) and import no torch as they start
    (``--cold-start``: no warm start) -- and such a start, or one that went past node 0's
    fence, is ended and made again, at most three times."""
    for attempt in range(4):
        where = tmp_path / f"start{attempt}"
        where.mkdir()
        made = _start_once(net, nodes, where)
        if made is not None:
            return (nodes[-3], *made, where)
        for node in nodes[-3:]:
            node.kill()
    raise AssertionError(
        "4 starts, and in none did the spare join at the start: each time node 0 was fenced, "
        "or the spare probed before it joined (as to a running job)"
    )


def _start_once(
    net: Loopback | NamespaceHosts, nodes: list[Node], where: Path
) -> tuple[Node, Node] | None:
    """One try of ``_a_spare_from_the_start`` (its three nodes appended to ``nodes``): the
    member and the spare, or None where the two did not join together."""
    port = free_port()
    args = [*c10d_args(net, port, "2:2"), "--max-restarts", "1", "--cold-start",
            worker("spare_round.py"), str(where), "go"]  # fmt: skip
    host = Node(net, 0, args, where, "n0", wrap=_ahead)
    nodes.append(host)
    wait_for(lambda: _joined(host), 60, "node 0 to join")
    both = _join_together(net, port, host, lambda i: Node(net, i, args, where, wrap=_ahead))
    nodes += both
    formed = lambda: (where / "up.0").exists() and (where / "up.1").exists()  # noqa: E731
    wait_for(lambda: formed() or "fenced" in host.stderr, 90, "round 0")
    if not formed():
        return None
    (spare,) = [n for n in both if not _kinds(_events(n), "rdzv_done")]
    (member,) = [n for n in both if n is not spare]
    wait_for(lambda: _joined(spare), 60, "the spare to join")
    wait_for(lambda: _kinds(_events(spare), "node_probe"), 60, "the spare to probe")
    (probe,) = _kinds(_events(spare), "node_probe")
    return None if probe["seq"] < _joined(spare)[0]["seq"] else (member, spare)  # (ahead: lost)


def _ahead(command: list[str]) -> list[str]:
    """``command`` at nice -10: scheduled ahead of the other tests' processes on a busy
    machine (the test runs as root, as CI does)."""
    return ["nice", "-n", "-10", *command]


def _both_connected(net: NamespaceHosts, port: int) -> bool:
    """Nodes 1 and 2 both hold a connection to node 0's ``port``, and still do a moment later:
    each first connects and closes to see the port answer, then connects for good."""
    both = lambda: all(connected(net, 0, port, net.addr(i)) for i in (1, 2))  # noqa: E731
    if not both():
        return False
    time.sleep(0.1)
    return both()


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
    # Node 0 first: on loopback every node is the endpoint's host, and whichever binds the
    # port first hosts the store; node 1, killed below, must not be the one.
    nodes.append(Node(net, 0, args, tmp_path, "n0"))
    wait_for(lambda: _joined(nodes[0]), 60, "node 0 to join")
    nodes.append(Node(net, 1, args, tmp_path, "n1"))
    wait_for(lambda: (tmp_path / "up.0").exists() and (tmp_path / "up.1").exists(), 90, "round 0")
    nodes.append(Node(net, 2, args, tmp_path, "n2", env={"SPARE": "1"}))
    wait_for(lambda: _joined(nodes[2]), 90, "the spare to join")
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
    """All three nodes join at the job's start (``_a_spare_from_the_start``): round 0 takes
    two, the third waits as the spare. It probes once while it waits (``node_probe``, round
    null, after its ``rdzv_start``), and not again in round 1, which takes it in when the
    other member is SIGKILLed: round 1's check has no probe on any node, and the spare's
    figure there is the one it measured while it waited."""
    net = hosts(3)  # type: ignore[operator]
    first, member, spare, where = _a_spare_from_the_start(net, nodes, tmp_path)  # (probed)
    member.kill()  # its whole session: agent, guardian, worker
    _go_once_checked(where, (first, spare))
    assert [first.finish(), spare.finish()] == [0, 0], first.stderr + spare.stderr
    assert "sum=3 world=2" in first.stdout + spare.stdout

    theirs, mine = _events(first), _events(spare)
    assert [e["round"] for e in _kinds(theirs, "node_probe")] == [0], _kinds(theirs, "node_probe")
    (probe,) = _kinds(mine, "node_probe")
    (start, *_) = _kinds(mine, "rdzv_start")
    (done,) = _kinds(mine, "rdzv_done")
    assert probe["round"] is None and start["seq"] < probe["seq"] < done["seq"], mine
    assert done["round"] == 1, done
    checks = {e["round"]: e for e in _kinds(theirs, "node_check")}
    (check,) = _kinds(mine, "node_check")
    assert sorted(checks) == [0, 1] and check["round"] == 1, (checks, check)
    assert _figure(checks[1], check) == probe["compute"], (checks[1], probe)
