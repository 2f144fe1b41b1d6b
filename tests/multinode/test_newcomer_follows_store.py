"""A node started after the c10d store failed over, with the job's one ``--rdzv-endpoint``
(the first store's host: torchrun's command line, the same on every node), joins the job
(docs/explanation/design.md, "When the store's host is lost").

Three agents at ``--nnodes 2:3``, each in a network namespace of its own, one endpoint (node
0's address); node 0, which serves the store, is SIGKILLed whole, and the two others fail
over to a successor on a member's address. Then:

- a node started on another address while nothing answers at the endpoint cannot find the
  job: it ends at its ``join_timeout`` in one line that says what to change (every node's
  address in ``--rdzv-endpoint``);
- node 0's machine comes back and the same command is run there: its agent serves a fresh
  store at the endpoint; the successor's host finds it there and leaves word of where the
  job's (confirmed) store is, and the agent follows it, joins the job as a newcomer and the
  job re-forms at world size 3 on the successor's store -- no round of its own on the fresh
  store, no second job under the run id. Before, it waited alone there until its
  ``join_timeout`` and the job finished without it.

The survivors' waiting line names the store they wait at, the successor's (it named the lost
first store). The workers need no torch (four agents are cheap to start).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from support.failover import CONF, HANG, PORT, kill_tree
from support.hosts import NamespaceHosts, Node
from support.launch import wait_for
from support.multinode import c10d_args
from support.netns import NetNamespaces

# A worker that needs no torch: it writes its node and world size per restart; it waits to
# be stopped until it runs at world size 3 after the loss (the newcomer in), then ends. At
# world size 2 it takes 3 s to stop: the newcomer waits that long to join, and says where.
SLEEPER = """import os, pathlib, signal, sys, time
restart, world = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["WORLD_SIZE"]
name, shared = f"r{restart}-rank{os.environ['RANK']}", pathlib.Path(sys.argv[1])
(shared / f".{name}").write_text(f"{os.environ['NODE']} {world}")
(shared / f".{name}").rename(shared / name)  # whole or absent: the test polls these files
if world == "2":
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(3), os._exit(143)))
if restart == "0" or world != "3":
    time.sleep(600)
"""


def _agent(hosts: NamespaceHosts, i: int, tmp_path: Path, name: str = "", conf: str = CONF) -> Node:
    """Node ``i``'s agent with the job's command line: one endpoint, node 0's address."""
    script, shared = tmp_path / "sleeper.py", tmp_path / "shared"
    args = [*c10d_args(hosts, PORT, "2:3", "newcomer", conf), "--max-restarts", "3",
            "--cold-start", str(script), str(shared)]  # fmt: skip
    return Node(hosts, i, args, tmp_path, name, env={"NODE": name or str(i)})


def _ran(shared: Path) -> dict[str, list[tuple[str, str]]]:
    """Each restart's workers: restart -> [(node, world size)], by rank."""
    found: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(shared.glob("r*-rank*")):
        restart = path.name.split("-")[0]
        node, world = path.read_text().split()
        found.setdefault(restart, []).append((node, world))
    return found


def test_a_node_started_after_the_failover_with_one_endpoint_joins_the_job(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    hosts, shared = NamespaceHosts(netns(4)), tmp_path / "shared"
    shared.mkdir()
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    for i in range(3):  # node 0, the endpoint's machine, serves the store
        nodes.append(_agent(hosts, i, tmp_path))
    wait_for(lambda: len(_ran(shared).get("r0", [])) == 3, HANG, "three nodes to run")
    kill_tree(nodes[0].proc.pid)

    # Another machine, the endpoint's host gone: nothing to follow; one line says what to do.
    lost = _agent(hosts, 3, tmp_path, "n3", CONF.replace("join_timeout=60", "join_timeout=3"))
    nodes.append(lost)
    assert lost.finish(HANG) == 1, lost.stderr[-4000:]
    (last,) = lost.stderr.strip().splitlines()[-1:]
    assert f"{hosts.addr(0)}:{PORT} did not answer" in last, last
    assert "give every node's address in --rdzv-endpoint" in last, last
    assert "Traceback" not in lost.stderr

    said = "serves the rendezvous store now at"
    wait_for(lambda: all(said in n.stderr for n in nodes[1:3]), HANG, "the survivors to move")
    (now,) = set(re.findall(rf"{said} (\S+) \(failover 1\)", nodes[1].stderr + nodes[2].stderr))
    assert now in {f"{hosts.addr(i)}:{PORT}" for i in (1, 2)}, now
    # Node 0's machine is back; the same command line there, as on any node.
    back = _agent(hosts, 0, tmp_path, "n0b")
    nodes.append(back)
    for node in [back, *nodes[1:3]]:  # (without the word: it ends alone at join_timeout)
        assert node.finish(HANG) == 0, node.stderr[-6000:]

    ran = _ran(shared)
    final = ran[max(ran, key=lambda r: int(r[1:]))]
    assert sorted(final) == [("1", "3"), ("2", "3"), ("n0b", "3")], ran  # ranks 0..2 of 3
    assert all(world in ("2", "3") for r in ran if r != "r0" for _, world in ran[r]), ran
    follows = f"this node, started at the lost store's place, follows it to {now}"
    assert follows in back.stderr, back.stderr[-4000:]
    assert "round 0: node rank" not in back.stderr  # no round of its own on the fresh store
    told = f"{hosts.addr(0)}:{PORT} serves a fresh store under this job's run id"
    assert any(told in n.stderr for n in nodes[1:3]), nodes[1].stderr[-3000:]
    # Every waiting line past the move names the store that serves: the newcomer's, while
    # the survivors' workers stop (3 s), and the survivors' if theirs waited too.
    serving = f"rendezvous: the store that took over, at {now} (failover 1)"
    after = [n.stderr.split(said, 1)[1] for n in nodes[1:3]] + [back.stderr.split(follows)[1]]
    waits = [x for text in after for x in text.splitlines() if "phalanx: waiting " in x]
    assert any(serving in x for x in back.stderr.split(follows)[1].splitlines()), back.stderr
    assert all(serving in x for x in waits), waits
