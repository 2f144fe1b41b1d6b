"""A fenced node rejoins (docs/explanation/design.md, "Fencing"): two real hosts (network namespaces), the c10d
store hosted by node 0's agent, one Gloo worker per node doing checked all-reduce steps
(``tests/workers/lossy_steps.py``), default heartbeat settings (a node fences 8 s after its
last proof, the others count it lost after 10 s).

Every packet of node 1 dropped (iptables DROP in its namespace, both ways) until it has
fenced, then let through again (the store's host paused instead: ``tests/rendezvous/test_rejoin.py``). Its
workers were SIGKILLed; with restarts left it reaches the store again and rejoins the next
round as a restart, and the job finishes with every step's sum right, exit 0 on both nodes.
With ``--max-restarts 0`` the fenced node ends as before: exit 1 and its one line.
Timeouts only catch hangs; the fault lasts until the fence has fired, however long that is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from phalanx.events import read_events
from phalanx.resources.ports import free_port
from support.hosts import NamespaceHosts, Node
from support.launch import wait_for, worker
from support.netns import NetNamespaces

HANG = 120.0
CONF = "last_call_timeout=1,join_timeout=60,exit_barrier_timeout=60"
FENCED = "phalanx: rendezvous: fenced: no store write confirmed this node alive"


def steps(out: Path, rank: int, restart: int) -> int:
    path = out / f"r{rank}-{restart}.steps"
    text = path.read_text() if path.exists() else ""
    return int(text) if text.isdigit() else 0


def start_pair(
    spaces: NetNamespaces, nodes: list[Node], tmp: Path, run_id: str, max_restarts: int
) -> Path:
    """Both agents, node 0 hosting the store; returns once both workers are stepping."""
    net = NamespaceHosts(spaces)
    port = free_port()
    out = tmp / "steps"
    out.mkdir()
    for i in (0, 1):
        conf = f"{CONF},is_host={str(i == 0).lower()}"
        args = ["--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", str(max_restarts),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{spaces.addr(0)}:{port}",
                "--rdzv-id", run_id, "--rdzv-conf", conf,
                worker("lossy_steps.py"), str(out)]  # fmt: skip
        nodes.append(Node(net, i, args, tmp, f"n{i}"))

    def stepping() -> bool:
        for node in nodes:
            assert node.proc.poll() is None, node.stderr
        return steps(out, 0, 0) > 0 and steps(out, 1, 0) > 0

    wait_for(stepping, HANG, "both workers to step")
    return out


def until_node_1_fenced(nodes: list[Node]) -> None:
    wait_for(lambda: FENCED in nodes[1].stderr, HANG, "node 1 to fence itself")


def finish_after_rejoin(nodes: list[Node], out: Path) -> None:
    """Both workers step in a later attempt; then stop them: both nodes succeed, world 2."""

    def stepping_again() -> bool:
        for node in nodes:
            assert node.proc.poll() is None, node.stderr
        return any(steps(out, 0, r) > 5 and steps(out, 1, r) > 5 for r in range(1, 4))

    try:
        wait_for(stepping_again, HANG, "both workers to step again in a restart")
    finally:
        (out / "stop").touch()
    codes = [node.finish(HANG) for node in nodes]
    assert codes == [0, 0], nodes[0].stderr + nodes[1].stderr
    for node in nodes:
        assert "ok world=2 steps=" in node.stdout, node.stdout
        assert "restart=0" not in node.stdout, node.stdout  # the restart's worker finished
        (events_file,) = node.logs.glob("*/events.jsonl")
        kinds = [e["kind"] for e in read_events(events_file)]
        assert "restart" in kinds, kinds
    assert "the store answers again; rejoining" in nodes[1].stderr, nodes[1].stderr


@pytest.mark.slow
def test_a_node_cut_off_past_the_fence_rejoins_once_healed(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    spaces = netns(2)
    out = start_pair(spaces, nodes, tmp_path, "cut-past-fence", max_restarts=2)
    spaces.silence(1, on=True)
    try:
        until_node_1_fenced(nodes)
    finally:
        spaces.silence(1, on=False)
    finish_after_rejoin(nodes, out)


@pytest.mark.slow
def test_a_fenced_node_without_restarts_left_ends_with_its_line(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    spaces = netns(2)
    out = start_pair(spaces, nodes, tmp_path, "fenced-no-budget", max_restarts=0)
    spaces.silence(1, on=True)
    try:
        until_node_1_fenced(nodes)
        assert nodes[1].finish(HANG) == 1, nodes[1].stderr
    finally:
        spaces.silence(1, on=False)
        (out / "stop").touch()
    assert nodes[0].finish(HANG) != 0, nodes[0].stderr  # (its peer lost, no restart left)
    err = nodes[1].stderr
    assert err.strip().splitlines()[-1].startswith("phalanx: the job stopped: fenced: "), err
    assert "rejoining" not in err and "Traceback" not in err, err
