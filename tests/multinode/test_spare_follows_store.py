"""A spare that loses the job's store follows the job to the successor's store
(docs/explanation/design.md, "When the store's host is lost"): four agents at ``--nnodes 3``
(c10d), each in a network namespace of its own, every node's address a candidate (or one
endpoint: the candidates are then the members); three run, the fourth waits as a spare. The store's host (node 0) is SIGKILLed whole, agent and workers.
The two survivors fail over; the spare, whose wait on the lost store failed, finds the
confirmed successor and the restart round takes it -- no agent started again (the lost host
is not), so before, with the spare gone down with the store, that round had only the two
survivors and failed below MIN. The workers need no torch (a few are cheap to start).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from support.failover import CONF, HANG, NODE_SLEEPER, PORT, events, kill_tree
from support.hosts import NamespaceHosts, Node
from support.launch import wait_for, worker
from support.multinode import c10d_args
from support.netns import NetNamespaces

# When the lost host's agent is let go, after both survivors moved to the successor's store
# (the second confirms it): later than the spare, which waits on that mark, can come; sooner
# than its next look came, when it looked every follow.EVERY (0.5 s) from the loss.
AGAIN = 0.1
# A pause that lets an agent's next store calls go out (two heartbeat intervals of CONF).
HELD = 1.0
# Node 0 held from its own store for a few seconds (a cold agent's start) must not count it
# lost meanwhile.
PATIENT = CONF.replace("heartbeat_timeout=4", "heartbeat_timeout=12")


def _agent(
    hosts: NamespaceHosts,
    i: int,
    tmp_path: Path,
    script: Path,
    shared: Path,
    listed: bool,
    name: str = "",
    wrap: Callable[[list[str]], list[str]] | None = None,
    conf: str = CONF,
) -> Node:
    rdzv = c10d_args(hosts, PORT, "3", "follow", conf)
    if listed:
        where = rdzv.index("--rdzv-endpoint") + 1
        rdzv[where] = ",".join(f"{hosts.addr(j)}:{PORT}" for j in range(4))
    args = [*rdzv, "--max-restarts", "1", "--cold-start", str(script), str(shared)]
    return Node(hosts, i, args, tmp_path, name, env={"NODE": str(i)}, wrap=wrap)


def on_go(go: Path) -> Callable[[list[str]], list[str]]:
    """The host's ``python -m phalanx ...`` run as ``agent_on_go.py GO ...``: imported at
    once, started when the file ``go`` appears."""

    def wrap(command: list[str]) -> list[str]:
        at = command.index("-m")
        return [*command[:at], worker("agent_on_go.py"), str(go), *command[at + 2 :]]

    return wrap


def _ran(shared: Path, restart: int) -> dict[str, str]:
    """Restart ``restart``'s workers: node -> world size."""
    found = (p.read_text().split() for p in shared.glob(f"r{restart}-rank*"))
    return {node: world for node, world in found}


@pytest.mark.parametrize("listed", [True, False], ids=["listed endpoints", "members"])
def test_a_waiting_spare_follows_the_lost_store_and_the_restart_round_takes_it(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path, listed: bool
) -> None:
    hosts, shared = NamespaceHosts(netns(4)), tmp_path / "shared"
    shared.mkdir()
    script = tmp_path / "sleeper.py"
    script.write_text(NODE_SLEEPER)
    # Listed, the spare sits at the second place, before both survivors: a place no member
    # is at gets one try in their walk (no waiting there: a spare never serves).
    first, last = ([0, 2, 3], 1) if listed else ([0, 1, 2], 3)
    for i in first:  # node 0, the first listed, serves the store
        nodes.append(_agent(hosts, i, tmp_path, script, shared, listed))
    wait_for(lambda: len(_ran(shared, 0)) == 3, HANG, "three nodes to run")
    assert _ran(shared, 0) == {str(i): "3" for i in first}
    spare = _agent(hosts, last, tmp_path, script, shared, listed)
    nodes.append(spare)
    wait_for(lambda: "a spare: it waits" in spare.stderr, HANG, "the fourth node to wait")
    kill_tree(nodes[0].proc.pid)
    for node in nodes[1:]:
        assert node.finish(HANG) == 0, node.stderr[-6000:]
    assert _ran(shared, 1) == {str(i): "3" for i in [*first[1:], last]}  # the spare ran a rank
    (now,) = re.findall(r"serves the rendezvous store now at (\S+) \(failover 1\)", nodes[1].stderr)
    assert now in {f"{hosts.addr(i)}:{PORT}" for i in first[1:]}, now  # a survivor serves it
    follows = f"this node, waiting outside the running round, follows it to {now}"
    assert follows in spare.stderr, spare.stderr[-4000:]


def test_the_restart_round_takes_the_spare_not_the_lost_hosts_agent_started_again(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    """The c10d soak's ``store_host_lost``: the lost host's agent is started again as soon as
    the job moved to the successor's store and joins the restart round there, as the spare
    does; the round takes whichever comes first, and the agent started again is cold (in the
    soak its template then imports torch for 1.7-1.8 s while the round waits). The spare
    waits on the successor's confirmation and comes first. Before, a look that found it not
    yet confirmed came back only ``follow.EVERY`` (0.5 s) later, and the agent started again
    took the place (in the soak it began its rendezvous 0.48-0.55 s after the loss).

    The soak's layout: every node's address a candidate, node 0's first, the spare last; the
    ranks linked as a collective links them (``linked_sleeper.py``), so the survivors find
    the loss at once. Node 0's agent is let go ``AGAIN`` after both survivors moved, its
    interpreter and imports paid before (``agent_on_go.py``): it reaches its rendezvous
    about when a cold one started at the loss would, and before the spare's next look
    would have come."""
    hosts, shared = NamespaceHosts(netns(4)), tmp_path / "shared"
    shared.mkdir()
    script = Path(worker("linked_sleeper.py"))
    for i in range(3):
        nodes.append(_agent(hosts, i, tmp_path, script, shared, True))
    wait_for(lambda: len(_ran(shared, 0)) == 3, HANG, "three nodes to run")
    spare = _agent(hosts, 3, tmp_path, script, shared, True)
    go = tmp_path / "go"
    again = _agent(hosts, 0, tmp_path, script, shared, True, "n0b", on_go(go))
    nodes += [spare, again]
    ready = Path(f"{go}.ready")
    wait_for(lambda: "a spare: it waits" in spare.stderr and ready.exists(), HANG, "the spare")
    kill_tree(nodes[0].proc.pid)
    moved = lambda: all("serves the rendezvous store now" in n.stderr for n in nodes[1:3])  # noqa: E731
    wait_for(moved, HANG, "both survivors to move", every=0.005)
    time.sleep(AGAIN)  # the fault's shape (when the agent is started again), not a wait
    go.touch()
    for node in nodes[1:]:  # the agent started again waits as a spare: not needed, exit 0
        assert node.finish(HANG) == 0, node.stderr[-6000:]
    said = "\n".join(f"--- {n.err.name}\n{n.stderr[-3000:]}" for n in nodes)
    assert _ran(shared, 1) == {"1": "3", "2": "3", "3": "3"}, said  # the spare ran a rank
    assert [e["round"] for e in events(spare, "rdzv_done")] == [1], said
    assert events(again, "rdzv_done") == [], said  # never in a round


def _hold_own_store(hosts: NamespaceHosts, i: int, *, on: bool) -> None:
    """Hold node ``i``'s agent's calls to the store it serves itself (the packets on its
    loopback to and from the store's port dropped; sent again once let through): the other
    nodes' calls, over its link, are answered meanwhile."""
    for side in ("--dport", "--sport"):
        rule = ["OUTPUT", "-o", "lo", "-p", "tcp", side, str(PORT), "-j", "DROP"]
        argv = ["iptables", "-A" if on else "-D", *rule]
        subprocess.run(hosts.command(i, argv), check=True, capture_output=True)


def test_a_spare_queued_before_round_0s_members_were_written_still_follows(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    """The c10d soak's first ``store_host_lost`` (seed 7): the spare, started with the others,
    took slot 4 just as round 0 closed, before node 0 (slot 1, the store's host) wrote its
    members; it read the running round once, found none, and when the store was lost had
    nothing to follow (``could not read which round this node was joining``): a cold agent
    took its place (7.9 s down). Forced here: node 0's own calls to its store are held (the
    others' answered) from before the third node closes round 0 until the spare waits; the
    spare keeps the round once its members are written, and follows the job."""
    hosts, shared = NamespaceHosts(netns(4)), tmp_path / "shared"
    shared.mkdir()
    script = tmp_path / "sleeper.py"
    script.write_text(NODE_SLEEPER)
    for i in range(2):  # node 0 first: slot 1 of round 0, the node that writes its members
        node = _agent(hosts, i, tmp_path, script, shared, True, conf=PATIENT)
        nodes.append(node)
        wait_for(lambda n=node: events(n, "rdzv_start") != [], HANG, f"node {i} to join")
        time.sleep(HELD)  # (its slot taken: ``began`` is said just before it asks for one)
    _hold_own_store(hosts, 0, on=True)
    try:  # slot 3 closes round 0, slot 4 queues as the spare (whichever of the two comes first)
        nodes += [_agent(hosts, i, tmp_path, script, shared, True, conf=PATIENT) for i in (2, 3)]
        waits = lambda: [n for n in nodes[2:] if "a spare: it waits" in n.stderr]  # noqa: E731
        wait_for(waits, HANG, "the fourth node to wait as the spare")
        (spare,) = waits()
        assert _ran(shared, 0) == {}, "round 0 ran before node 0 wrote its members"
    finally:
        _hold_own_store(hosts, 0, on=False)
    wait_for(lambda: len(_ran(shared, 0)) == 3, HANG, "three nodes to run")
    time.sleep(HELD)  # the spare's next turn of its wait (every heartbeat_interval) reads them
    kill_tree(nodes[0].proc.pid)
    codes = [node.finish(HANG) for node in nodes[1:]]
    said = "\n".join(f"--- {n.err.name}\n{n.stderr[-3000:]}" for n in nodes)
    assert codes == [0, 0, 0], said
    assert "could not read which round" not in spare.stderr, said
    assert "waiting outside the running round, follows it to" in spare.stderr, said
    assert _ran(shared, 1) == {"1": "3", "2": "3", "3": "3"}, said  # the spare ran a rank
    assert [e["round"] for e in events(spare, "rdzv_done")] == [1], said
