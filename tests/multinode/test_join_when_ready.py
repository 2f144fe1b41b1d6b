"""A node that comes to a running job joins only once its warm-start template has imported;
at the job's start every node joins at once, its import running under the rendezvous.

Issue 41: the first agent SIGKILL of a soak cost 1.5-2.5 s more than the others because the
agent started again was chosen by the restart round while its template still imported torch,
and the whole job waited for it. The first fix made every agent wait for its template, also
at the job's start: there the store's host (the slowest import) arrived last and was left out
as the spare.

Real agents, real c10d store and Gloo, each node on a host of its own. A ``--preload`` module
whose import is slow only where ``SLOW_IMPORT_STAMP`` is set stamps the time it ended. The
order of events against that stamp, on one clock -- never a timing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from phalanx.events import read_events
from phalanx.resources.ports import free_port
from support.hosts import Node
from support.launch import wait_for, worker
from support.multinode import FAST, c10d_args

# Slow only where SLOW_IMPORT_STAMP is set; the same --preload on every node.
SLOW_IMPORT = (
    "import os, time\n"
    "stamp = os.environ.get('SLOW_IMPORT_STAMP')\n"
    "if stamp:\n"
    "    time.sleep(3)\n"
    "    with open(stamp, 'w') as f:\n"
    "        f.write(repr(time.time()))\n"
)


def _events(node: Node, kind: str) -> list[dict[str, Any]]:
    (path,) = node.logs.glob("*/events.jsonl")
    return [e for e in read_events(path) if e["kind"] == kind]


def test_a_late_node_joins_once_its_template_has_imported(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """Node 0 runs alone (``--nnodes 1:2``), then node 1 comes with the slow import: it must
    not join (``rdzv_start``) before the import's stamp, so the round that takes it in -- the
    job's re-form -- forms after it too."""
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    (tmp_path / "slow_import.py").write_text(SLOW_IMPORT)
    stamp = tmp_path / "stamp"
    args = [*c10d_args(net, port, "1:2"), "--preload", "slow_import",
            worker("late_join.py"), str(tmp_path)]  # fmt: skip
    nodes.append(Node(net, 0, args, tmp_path, "n0", cwd=tmp_path))
    wait_for(lambda: (tmp_path / "alone").exists(), 90, "node 0 to start alone after the last call")
    nodes.append(
        Node(net, 1, args, tmp_path, "n1", cwd=tmp_path, env={"SLOW_IMPORT_STAMP": str(stamp)})
    )
    assert [n.finish() for n in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    assert "world=2 sum=2 restart=0" in nodes[1].stdout
    imported = float(stamp.read_text())
    joins = [e["t"] for e in _events(nodes[1], "rdzv_start")]
    assert joins and min(joins) >= imported, (joins, imported)
    rounds = [e for e in _events(nodes[0], "rdzv_done") if e["world_size"] == 2]
    assert rounds and rounds[0]["t"] >= imported, (rounds, imported)


def test_at_the_start_the_store_host_joins_under_its_import_and_is_no_spare(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """Three nodes at ``--nnodes 2``: node 0 hosts the store and has the slow import; the
    others start as soon as it has. Node 0 joins round 0 before its import ended (the start is
    not held up for it) and is a member of it; one of the others waits as the spare and leaves
    with 0 when the job ends without it."""
    net = hosts(3)  # type: ignore[operator]
    port = free_port()
    (tmp_path / "slow_import.py").write_text(SLOW_IMPORT)
    stamp = tmp_path / "stamp"
    args = [*c10d_args(net, port, "2"), "--preload", "slow_import",
            worker("late_join.py"), str(tmp_path)]  # fmt: skip
    env = {"SLOW_IMPORT_STAMP": str(stamp)}
    nodes.append(Node(net, 0, args, tmp_path, "n0", cwd=tmp_path, env=env))
    wait_for(lambda: list(nodes[0].logs.glob("*/events.jsonl")), 60, "node 0's run to start")
    nodes += [Node(net, i, args, tmp_path, f"n{i}", cwd=tmp_path) for i in (1, 2)]
    assert [n.finish() for n in nodes] == [0, 0, 0], "".join(n.stderr for n in nodes)
    imported = float(stamp.read_text())
    (join,) = _events(nodes[0], "rdzv_start")
    assert join["t"] < imported, (join, imported)
    (formed,) = _events(nodes[0], "rdzv_done")  # a member of round 0, not the spare
    assert formed["round"] == 0, formed
    ran = [n for n in nodes if "world=2 sum=2 restart=0" in n.stdout]
    assert nodes[0] in ran and len(ran) == 2, [n.stdout for n in nodes]


def test_a_node_the_restart_round_needs_joins_before_its_template_is_ready(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """``--nnodes 2``, no spare: node 1's agent and worker SIGKILLed, then started again with
    the slow import. The restart round cannot close without it (below MIN it fails at its last
    call, 10 s here: its start under load must not decide the test): it joins as soon as that
    round waits for a node, before its import's stamp, and the job finishes in that round."""
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    (tmp_path / "slow_import.py").write_text(SLOW_IMPORT)
    stamp = tmp_path / "stamp"
    conf = FAST.replace("last_call_timeout=1", "last_call_timeout=10")
    args = [*c10d_args(net, port, "2", conf=conf), "--max-restarts", "1", "--preload", "slow_import",
            worker("spare_round.py"), str(tmp_path)]  # fmt: skip
    nodes += [Node(net, i, args, tmp_path, f"n{i}", cwd=tmp_path) for i in (0, 1)]
    wait_for(lambda: (tmp_path / "up.0").exists() and (tmp_path / "up.1").exists(), 90, "round 0")
    nodes[1].kill()  # its whole session: agent, guardian, worker
    env = {"SLOW_IMPORT_STAMP": str(stamp)}
    nodes.append(Node(net, 1, args, tmp_path, "n1-again", cwd=tmp_path, env=env))
    assert [nodes[0].finish(), nodes[2].finish()] == [0, 0], nodes[0].stderr + nodes[2].stderr
    assert "sum=3 world=2" in nodes[0].stdout + nodes[2].stdout
    imported = float(stamp.read_text())
    (join,) = _events(nodes[2], "rdzv_start")
    assert join["t"] < imported, (join, imported)
