"""The c10d store's host is lost and its agent is started again at once, with the same
command, as systemd or a Slurm requeue would (docs/explanation/design.md, "When the store's
host is lost"). The new agent serves a fresh, empty store at the lost store's place, which
the survivors' walk tries first: they must not take it for the job's (it holds no round, no
restart count, no crash-loop evidence), but fail over to the next candidate as if the place
did not answer, and finish there with the job's state (the restart budget spent once, the
run resumed from its checkpoint, bit-identical to an uninterrupted run).

The order is forced: the survivors' agents are held (SIGSTOP) while node 0's agent and
workers are SIGKILLed and its agent started again, until the new agent serves; only then do
the survivors look for a successor. Three agents at ``--nnodes 2:3``, one Gloo worker each.
The survivors tell the agent on the empty store, which ends at once; started again, it joins
the job on the successor's store.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from support.failover import (
    HANG,
    PORT,
    agent,
    kill_tree,
    reference_weights,
    start_three,
    survivors_finished,
    then_fast,
    training,
    world_again,
)
from support.hosts import Node
from support.launch import wait_for
from support.netns import NetNamespaces


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return reference_weights(tmp_path_factory.mktemp("reference"))


def test_a_store_host_started_again_at_once_is_not_taken_for_the_jobs_store(
    netns: Callable[[int], NetNamespaces],
    nodes: list[Node],
    tmp_path: Path,
    reference: bytes,
) -> None:
    spaces = netns(3)
    hosts, shared = start_three(spaces, nodes, tmp_path, listed=True)
    wait_for(training(nodes, shared), HANG, "all three nodes to train")
    held = [nodes[1].proc.pid, nodes[2].proc.pid]
    for pid in held:
        os.kill(pid, signal.SIGSTOP)
    try:
        kill_tree(nodes[0].proc.pid)
        nodes[0].proc.wait(10)
        again = agent(hosts, 0, tmp_path, "2:3", True, "n0b")
        nodes.append(again)
        wait_for(lambda: "waiting for" in again.stderr, HANG, "node 0's new agent to serve")
    finally:
        for pid in held:
            os.kill(pid, signal.SIGCONT)
    # Told by the survivors, the agent on the empty store ends at once (not at join_timeout),
    # and started again (its supervisor would) it joins the job on the successor's store.
    assert again.finish(HANG) == 1, again.stderr[-4000:]
    place = f"{hosts.addr(0)}:{PORT}"
    assert f"the job's store at {place} was lost before this agent started again" in again.stderr
    assert "round 0: node rank" not in again.stderr  # no round formed on the empty store
    third = agent(hosts, 0, tmp_path, "2:3", True, "n0c")
    nodes.append(third)
    then_fast(shared, world_again(shared, 3), "the job to re-form with it")
    survivors_finished(nodes, hosts, shared, reference, listed=True)
    # The survivor that finds it there ends it; one that tries the place after that finds no
    # store there (both resumed at once under load: only the first met it, ci55).
    told = [
        node
        for node in nodes[1:3]
        if f"{place} serves a store that is not the job's" in node.stderr
    ]
    assert told, nodes[1].stderr[-4000:] + nodes[2].stderr[-4000:]
    assert third.finish(HANG) == 0, third.stderr[-4000:]
    assert f"(failover 1): joining it at {hosts.addr(1)}:{PORT}" in third.stderr
    assert "world=3" in (shared / "steps-1").read_text()  # re-formed with it, no restart
