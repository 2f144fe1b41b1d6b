"""A member lost while every other member fenced is found lost by the restart round itself.

Seen in the c10d soak (seed 4141): the store's host stopped answering for 10 s (its agent
frozen) just as a member's agent was SIGKILLed. The other members fenced, and came back as
new members once the store answered: none of round 0's watchers was left, so the killed
member was never found lost, and the restart round waited for its place until
``join_timeout`` ended the job. Now the nodes waiting in the restart round judge the
unsettled members by the watchers' rule (``abandoned.Abandoned.settle_lost``).

Real agents on loopback, a real c10d store (served by one of them), one worker per node that
does not import torch: the store's host frozen by SIGSTOP past the fence, a member's whole
session SIGKILLed meanwhile (no last word: its guardian goes too); then the two left resume
the job from its checkpoint as a round of 2.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil

from phalanx.resources.ports import free_port
from support.hosts import Loopback, Node
from support.launch import wait_for, worker
from support.multinode import c10d_args

HANG = 120.0
FREEZE = 6.0  # past the fence (heartbeat_timeout 6 s - 2 s), as the soak's 10 s was
CONF = (
    "heartbeat_interval=0.5,heartbeat_timeout=6,last_call_timeout=1,join_timeout=90,"
    "exit_barrier_timeout=30"
)


def _serves(pid: int, port: int) -> bool:
    connections = psutil.Process(pid).net_connections(kind="tcp")
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in connections)


def test_a_member_lost_while_the_others_fenced_does_not_hold_the_restart_round(
    nodes: list[Node], tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    port = free_port()
    args = [*c10d_args(Loopback(), port, "2:3", "watchers-gone", CONF), "--max-restarts", "2",
            worker("resume_after_all_lost.py"), str(shared)]  # fmt: skip
    first = [Node(Loopback(), i, args, tmp_path, f"n{i}") for i in range(3)]
    nodes.extend(first)
    wait_for(lambda: all((shared / f"up.{r}").exists() for r in range(3)), HANG, "round 0")
    (host,) = [n for n in first if _serves(n.proc.pid, port)]
    lost = next(n for n in first if n is not host)
    other = next(n for n in first if n not in (host, lost))
    os.kill(host.proc.pid, signal.SIGSTOP)
    try:
        lost.kill()  # the agent's whole session, its guardian too: no last word
        time.sleep(FREEZE)  # the fault's length, not a wait for a condition
    finally:
        os.kill(host.proc.pid, signal.SIGCONT)
    for node in (host, other):
        assert node.finish(HANG) == 0, node.stderr[-4000:]
    # The case itself: the member that was not frozen fenced and came back as a new member,
    # so no watcher of round 0 was left but the restart round's own judgement.
    assert "rejoining as a new member" in other.stderr, other.stderr[-4000:]
    said = sorted(node.stdout.strip() for node in (host, other))
    assert said == [f"[rank{r}]: resumed rank={r} step=5 restart=1 world=2" for r in (0, 1)], said
    told = host.stderr + other.stderr
    assert "neither rejoined nor were found lost" not in told, told[-4000:]
