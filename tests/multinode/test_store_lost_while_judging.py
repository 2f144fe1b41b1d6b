"""The c10d store's host is lost while the other nodes wait on the job's verdict on a failed
round (docs/explanation/design.md, "When the store's host is lost"): they fail over as after
any loss, and the job goes on. Three agents at ``--nnodes 2:3``, each in a network namespace
of its own, every node's address a candidate. The moment is forced: node 2's agent is frozen
(SIGSTOP), so the verdict waits on its evidence; node 1's worker is SIGKILLed (a failed
round); once nodes 0 and 1 are judging, the store's host (node 0) is SIGKILLed whole, and
node 2 let go. Before, node 1's wait on the verdict failed and the job ended ("the restart
round could not form: ... wait [...verdict]: the server closed the connection"; the soak's
sixth ``store_host_lost``). The workers need no torch.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from support.failover import CONF, HANG, NODE_SLEEPER, PORT, events, kill_tree
from support.hosts import NamespaceHosts, Node
from support.launch import wait_for
from support.multinode import c10d_args
from support.netns import NetNamespaces

# The frozen node is found lost (and the verdict judged without it) only after this long:
# the window in which the store's host is lost while the others wait on the verdict.
CONF_SLOW_LOSS = CONF.replace("heartbeat_timeout=4", "heartbeat_timeout=12")
# Once both show they left the round for the verdict: the judging (two adds and a wait) has
# begun within milliseconds; this leaves a loaded machine room, and is far inside the window.
JUDGING = 2.0


def _ran(shared: Path, restart: int) -> dict[str, str]:
    """Restart ``restart``'s workers: node -> world size."""
    found = (p.read_text().split() for p in shared.glob(f"r{restart}-rank*"))
    return {node: world for node, world in found}


def _worker(agent: int, script: Path) -> psutil.Process:
    """The worker under agent ``agent`` (the process that runs ``script``, not the agent)."""
    for proc in psutil.Process(agent).children(recursive=True):
        line = proc.cmdline()
        if str(script) in line and "--rdzv-backend" not in line:
            return proc
    raise AssertionError(f"no worker under agent {agent}")


def test_the_store_host_lost_during_the_verdict_wait_the_others_fail_over(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    hosts, shared = NamespaceHosts(netns(3)), tmp_path / "shared"
    shared.mkdir()
    script = tmp_path / "sleeper.py"
    script.write_text(NODE_SLEEPER)
    for i in range(3):
        rdzv = c10d_args(hosts, PORT, "2:3", "verdict", CONF_SLOW_LOSS)
        rdzv[rdzv.index("--rdzv-endpoint") + 1] = ",".join(
            f"{hosts.addr(j)}:{PORT}" for j in range(3)
        )
        args = [*rdzv, "--max-restarts", "2", "--cold-start", str(script), str(shared)]
        nodes.append(Node(hosts, i, args, tmp_path, env={"NODE": str(i)}))
    wait_for(lambda: len(_ran(shared, 0)) == 3, HANG, "three nodes to run")
    frozen = nodes[2].proc.pid
    os.kill(frozen, signal.SIGSTOP)
    try:
        _worker(nodes[1].proc.pid, script).kill()
        judging = lambda: (  # noqa: E731
            "killed by SIGKILL (attempt 0)" in nodes[1].stderr
            and "stopped local workers" in nodes[0].stderr
        )
        wait_for(judging, HANG, "nodes 0 and 1 to leave the failed round", every=0.01)
        time.sleep(JUDGING)  # into the verdict wait, which waits on the frozen node
        assert events(nodes[1], "restart") == [], nodes[1].stderr[-3000:]  # still judging
        kill_tree(nodes[0].proc.pid)
    finally:
        os.kill(frozen, signal.SIGCONT)
    codes = [node.finish(HANG) for node in nodes[1:]]
    said = "\n".join(f"--- {n.err.name}\n{n.stderr[-3000:]}" for n in nodes)
    assert codes == [0, 0], said
    assert "could not form" not in said, said
    assert "serves the rendezvous store now" in nodes[1].stderr, said
    assert _ran(shared, 1) == {"1": "2", "2": "2"}, said  # the job went on with the two
