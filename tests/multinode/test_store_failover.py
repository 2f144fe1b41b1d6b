"""The c10d store's host is lost and the job goes on without it (docs/explanation/design.md,
"When the store's host is lost"): three agents at ``--nnodes 2:3``, each in a network
namespace of its own, node 0's agent serving the store, train a checkpointing trainer whose
result does not depend on the world size (``tests/workers/failover_train.py``). The fault is
made for real -- node 0's agent and workers SIGKILLed, its agent frozen (SIGSTOP) past
``heartbeat_timeout``, its link taken down -- and the two others fail over to a successor,
resume from the checkpoint and finish bit-identical to an uninterrupted run; node 0 never
serves the job again. The same under ``--hostfile`` with real sshd hosts is in
``test_store_failover_ssh.py`` (split so that two pytest workers run the halves).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from phalanx.errors import CUT_OFF_EXIT_CODE
from support.failover import (
    CONF,
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
from support.hosts import NamespaceHosts, Node
from support.launch import wait_for
from support.multinode import c10d_args
from support.netns import NetNamespaces


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return reference_weights(tmp_path_factory)


@pytest.mark.parametrize("listed", [False, True], ids=["members", "listed endpoints"])
def test_the_store_host_sigkilled_the_others_fail_over_and_finish(
    netns: Callable[[int], NetNamespaces],
    nodes: list[Node],
    tmp_path: Path,
    reference: bytes,
    listed: bool,
) -> None:
    spaces = netns(3)
    hosts, shared = start_three(spaces, nodes, tmp_path, listed=listed)
    wait_for(training(nodes, shared), HANG, "all three nodes to train")
    kill_tree(nodes[0].proc.pid)
    nodes[0].proc.wait(10)
    if listed:  # node 0 started again: it finds the successor's store and joins the job there
        moved = lambda: any("store now" in n.stderr for n in nodes[1:3])  # noqa: E731
        wait_for(moved, HANG, "a failover")
        nodes.append(agent(hosts, 0, tmp_path, "2:3", listed, "n0b"))
        then_fast(shared, world_again(shared, 3), "the job to re-form with it")
    else:  # the two went on: the steps left need not take 0.2 s each
        then_fast(shared, world_again(shared, 2), "the two to go on without it")
    survivors_finished(nodes, hosts, shared, reference, listed)
    if listed:
        assert nodes[3].finish(HANG) == 0, nodes[3].stderr[-4000:]
        said = nodes[3].stderr
        assert f"the job's store moved (failover 1): joining it at {hosts.addr(1)}:{PORT}" in said
        assert "world=3" in (shared / "steps-1").read_text()  # re-formed with it, no restart


def test_a_frozen_store_host_does_not_come_back_as_a_second_store(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path, reference: bytes
) -> None:
    spaces = netns(3)
    # Slow steps (0.5 s) until node 0 has ended (then OUT_DIR/fast): the job must still run on
    # the successor's store when node 0, resumed, looks for it there.
    hosts, shared = start_three(spaces, nodes, tmp_path, delay="0.5")
    wait_for(training(nodes, shared), HANG, "all three nodes to train")
    marks = [(time.time(), "node 0's agent SIGSTOPped")]
    os.kill(nodes[0].proc.pid, signal.SIGSTOP)
    try:
        # Both moved: the restart round formed on the successor's store, which a quorum of
        # the members thus reached (confirmed). Not merely "store now" said by both: the
        # later one says it before it reaches that store, and a successor host that waited
        # alone there for twice heartbeat_timeout (a loaded machine: node 2 late) goes back
        # to the old store once it answers (goback.py): node 0, resumed in that window,
        # formed round 1 with it there (ci58). A host back while one still tries to reach
        # the successor is that other case (design.md, "A member cut off for a moment").
        def moved() -> bool:
            said = [node.stderr for node in nodes[1:3]]
            return all("store now" in s and "round 1: node rank" in s for s in said)

        wait_for(moved, HANG, "both to fail over and re-form")
        marks.append((time.time(), "nodes 1 and 2 both moved and formed round 1"))
    finally:
        os.kill(nodes[0].proc.pid, signal.SIGCONT)
        marks.append((time.time(), "node 0's agent SIGCONTinued"))
    code = nodes[0].finish(HANG)
    marks.append((time.time(), f"node 0's agent exited {code}"))
    (shared / "fast").touch()
    last = nodes[0].stderr.strip().splitlines()[-1]
    # Three ways it may learn it is out, each ending it: the newer store (superseded) or too
    # few members on its old store (cut off: out of the job, exit 79), or its own fence (no
    # heartbeat confirmed while it was frozen: under load it can fence before it looks for a
    # newer store; the job ends there with no restart left for it).
    ends = {"superseded": 79, "at least 2 needed": 79, "fenced: no store write": 1}
    # A failure says all of it: the test's steps and every node's events and output (ci58
    # printed only node 0's, which did not say who formed round 1 with it).
    said = [c for end, c in ends.items() if end in last]
    assert said == [code], _story(nodes, marks)
    assert code == 1 or ("the job stopped" not in last and "out of the job" in last), last
    assert "rejoining as a new member" not in nodes[0].stderr, _story(nodes, marks)
    assert "round 1" not in nodes[0].stderr, _story(nodes, marks)  # no round of its own
    survivors_finished(nodes, hosts, shared, reference)


_COMMON = ("v", "t", "mono", "seq", "host", "run_id")


def _story(nodes: list[Node], marks: list[tuple[float, str]]) -> str:
    """What a next person needs when a node ends otherwise than the test expects: one
    timeline (wall clock) of the test's own steps and every node's events (but the periodic
    progress ones), then each node's exit code (None: still running) and the end of its
    output."""
    lines = [f"{t:.3f} test: {what}" for t, what in marks]
    for i, node in enumerate(nodes):
        for path in sorted(node.logs.rglob("events.jsonl")):
            for line in path.read_text().splitlines():
                record = json.loads(line)
                if record["kind"] == "progress":
                    continue  # (periodic: the steps are in the output)
                rest = {k: v for k, v in record.items() if k not in _COMMON}
                lines.append(f"{record['t']:.3f} n{i}: {json.dumps(rest)[:300]}")
    story = ["timeline:", *sorted(lines)]
    for i, node in enumerate(nodes):
        story += [f"--- node {i}: exit {node.proc.poll()}; stderr:", node.stderr[-3000:]]
    return "\n".join(story)


def test_a_partition_one_side_goes_on_the_cut_off_store_host_stops(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path, reference: bytes
) -> None:
    """At ``--nnodes 1:3`` the store's host alone would be enough nodes, and with the spare
    that waits on its side (on its machine) two: but only the last round's members count,
    and it alone is not a half of the 3; the two others are a strict majority
    (``majority``). Counting the spare, both sides would run a round."""
    spaces = netns(3)
    # 1 s steps until the two go on without it: a spare's start under load outlasted 40
    # steps at 0.2 s, and node 0 finished before its cut (a whole-suite run at load 15).
    hosts, shared = start_three(spaces, nodes, tmp_path, "1:3", delay="1")
    wait_for(training(nodes, shared), HANG, "all three nodes to train")
    spare = agent(hosts, 0, tmp_path, "1:3", False, "n0-spare")
    nodes.append(spare)
    wait_for(lambda: "a spare: it waits" in spare.stderr, HANG, "the spare to wait")
    spaces.cut(0)
    try:
        assert nodes[0].finish(HANG) == CUT_OFF_EXIT_CODE, nodes[0].stderr[-4000:]
        then_fast(shared, world_again(shared, 2), "the two to go on without it")
        last = nodes[0].stderr.strip().splitlines()[-1]
        left = "cut off: only 1 of the last round's 3 members are left on this store after round"
        assert left in last and "(at least 2 needed)" in last, last
        assert "this node is out of the job, which goes on without it" in last, last
        assert spare.finish(HANG) == 0, spare.stderr[-4000:]  # not needed: it never ran
        assert "not needed" in spare.stderr and "round 1: node rank" not in spare.stderr
        survivors_finished(nodes, hosts, shared, reference)
    finally:
        spaces.heal(0)


# A worker that needs no torch: it says its world size per restart, and in restart 0 it
# waits to be stopped (the job re-forms after the losses), later it finishes at once.
SLEEPER = """import os, pathlib, sys, time
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
name = f"r{restart}-rank{os.environ['RANK']}"
(pathlib.Path(sys.argv[1]) / name).write_text(os.environ["WORLD_SIZE"])
if restart == "0":
    time.sleep(600)
"""


def test_a_member_lost_with_the_store_host_is_not_waited_for_until_join_timeout(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    """Five agents (no torch: cheap) at ``--nnodes 3:5``; the store's host and one more
    member SIGKILLed together. On the successor's store nobody has the second one's
    heartbeats: it is given up once the three survivors (a strict majority of 5) are there
    and its keepalive expired, and the restart round forms with the three -- before, it
    waited for it until join_timeout (600 s here) and then failed."""
    spaces = netns(5)
    hosts, shared = NamespaceHosts(spaces), tmp_path / "shared"
    shared.mkdir()
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    conf = CONF.replace("join_timeout=60", "join_timeout=600")
    for i in range(5):
        rdzv = c10d_args(hosts, PORT, "3:5", "failover", conf)
        rdzv[rdzv.index("--rdzv-endpoint") + 1] = ",".join(
            f"{hosts.addr(j)}:{PORT}" for j in range(5)
        )
        args = [*rdzv, "--max-restarts", "1", "--cold-start", str(script), str(shared)]
        nodes.append(Node(hosts, i, args, tmp_path))
    started = lambda: len(list(shared.glob("r0-*"))) == 5  # noqa: E731
    wait_for(started, HANG, "all five nodes to run")
    assert {(shared / f"r0-rank{r}").read_text() for r in range(5)} == {"5"}
    for i in (0, 4):
        kill_tree(nodes[i].proc.pid)
    for node in nodes[1:4]:
        assert node.finish(HANG) == 0, node.stderr[-6000:]
        assert "serves the rendezvous store now" in node.stderr, node.stderr[-4000:]
    assert {p.read_text() for p in shared.glob("r1-*")} == {"3"}, list(shared.iterdir())
