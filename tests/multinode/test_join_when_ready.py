"""A node that comes to a running job joins only once its warm-start template has imported
(issue 41: the first agent SIGKILL of a soak cost 1.5-2.5 s more than the others because the
agent started again was chosen by the restart round while its template still imported torch,
and the whole job waited for it).

Real agents, real c10d store and Gloo: node 0 runs alone (``--nnodes 1:2``), then node 1
comes with a ``--preload`` module whose import is slow on node 1 only and stamps the time it
ended. Node 1 must not join (``rdzv_start``) before that stamp, so the round that takes it
in -- the job's re-form -- forms after it too. The order of events on one clock, not a timing.
"""

from __future__ import annotations

from pathlib import Path

from phalanx.events import read_events
from phalanx.resources.ports import free_port
from support.hosts import Node
from support.launch import wait_for, worker
from support.multinode import c10d_args

# Slow only where SLOW_IMPORT_STAMP is set (node 1); the same --preload on both nodes.
SLOW_IMPORT = (
    "import os, time\n"
    "stamp = os.environ.get('SLOW_IMPORT_STAMP')\n"
    "if stamp:\n"
    "    time.sleep(3)\n"
    "    with open(stamp, 'w') as f:\n"
    "        f.write(repr(time.time()))\n"
)


def test_a_late_node_joins_once_its_template_has_imported(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
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
    (late,) = nodes[1].logs.glob("*/events.jsonl")
    joins = [e["t"] for e in read_events(late) if e["kind"] == "rdzv_start"]
    assert joins and min(joins) >= imported, (joins, imported)
    (first,) = nodes[0].logs.glob("*/events.jsonl")
    rounds = [e for e in read_events(first) if e["kind"] == "rdzv_done" and e["world_size"] == 2]
    assert rounds and rounds[0]["t"] >= imported, (rounds, imported)
