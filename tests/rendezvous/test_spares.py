"""Hot spares: an agent beyond ``--nnodes MAX`` waits for the next round; when a member
agent is SIGKILLed, the spare is in the next round and the job finishes with the right
result. Real agents (c10d, network namespaces), one worker each."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from phalanx.resources.ports import free_port
from support.hosts import Node
from support.launch import wait_for, worker
from support.multinode import FAST, c10d_args


def test_a_waiting_spare_replaces_a_killed_member(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    net = hosts(3)  # type: ignore[operator]
    shared = tmp_path / "shared"
    shared.mkdir()
    port = free_port()
    # join_timeout 8 s, and the spare waits past it before the loss: a spare is not timed
    # out while the job runs, and it has the whole timeout again for the round it joins.
    conf = FAST.replace("join_timeout=60", "join_timeout=8")
    args = [*c10d_args(net, port, "2:2", conf=conf), "--max-restarts", "1", "--cold-start",
            worker("spare_round.py"), str(shared)]  # fmt: skip
    for i in (0, 1):
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    wait_for(lambda: (shared / "up.0").exists() and (shared / "up.1").exists(), 120, "round 0")
    spare = Node(net, 2, args, tmp_path, "spare", env={"SPARE": "1"})
    nodes.append(spare)
    wait_for(lambda: "is running without this node" in spare.stderr, 60, "the spare waiting")
    time.sleep(10)
    member = nodes[1]
    member.kill()  # SIGKILL of the member agent's whole session (its worker too)
    assert nodes[0].finish(timeout=180) == 0, nodes[0].stderr + spare.stderr
    assert spare.finish(timeout=60) == 0, spare.stderr
    assert "sum=3 world=2 spare" in spare.stdout, spare.stdout + spare.stderr
    assert "sum=3 world=2" in nodes[0].stdout


# (heartbeat_timeout, seconds frozen before the member's loss, after it): the 5 s
# hiccup; and a freeze past fence_after (heartbeat_timeout - 2 s), so that a fence armed while
# the spare waited would fire when it came back and cost a second restart (there is one).
FREEZES = [pytest.param(15, 0, 5, id="5s"), pytest.param(10, 4, 5, id="past-fence_after")]


@pytest.mark.parametrize(("timeout", "before", "after"), FREEZES)
def test_a_spare_frozen_when_chosen_is_waited_for(
    hosts: object, nodes: list[Node], tmp_path: Path, timeout: int, before: float, after: float
) -> None:
    """Issue 37, item 2: the spare agent (and its guardian) SIGSTOPped, a member agent
    SIGKILLed (its guardian says so: the loss is known at once), the spare SIGCONTed 5 s
    later. The restart round waits past its last call for the queued spare, whose heartbeat
    is younger than heartbeat_timeout, and the job re-forms with it and finishes 0 with its
    one restart (it used to close with 1 node, "only 1 node(s) are left", and end 1)."""
    net = hosts(3)  # type: ignore[operator]
    shared = tmp_path / "shared"
    shared.mkdir()
    port = free_port()
    conf = FAST.replace("heartbeat_timeout=4", f"heartbeat_timeout={timeout}")
    args = [*c10d_args(net, port, "2:2", conf=conf), "--max-restarts", "1", "--cold-start",
            worker("spare_round.py"), str(shared)]  # fmt: skip
    for i in (0, 1):
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    wait_for(lambda: (shared / "up.0").exists() and (shared / "up.1").exists(), 120, "round 0")
    spare = Node(net, 2, args, tmp_path, "spare", env={"SPARE": "1"})
    nodes.append(spare)
    wait_for(lambda: "is running without this node" in spare.stderr, 60, "the spare waiting")
    os.killpg(spare.proc.pid, signal.SIGSTOP)  # the agent and its guardian: the whole node
    try:
        time.sleep(before)
        os.kill(nodes[1].proc.pid, signal.SIGKILL)  # the agent only: its guardian tells
        time.sleep(after)
    finally:
        os.killpg(spare.proc.pid, signal.SIGCONT)
    assert nodes[0].finish(timeout=180) == 0, nodes[0].stderr + spare.stderr
    assert spare.finish(timeout=60) == 0, spare.stderr
    assert "sum=3 world=2 spare" in spare.stdout, spare.stdout + spare.stderr
    assert "sum=3 world=2" in nodes[0].stdout
    assert "only 1 node(s) are left" not in nodes[0].stderr
    assert "fenced" not in spare.stderr, spare.stderr


def test_a_spare_left_behind_by_a_failed_job_is_not_needed(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """A job at MAX fails for good (a worker exits 3, no restarts) while a spare waits: the
    spare leaves with exit 0 and says it was not needed (it used to say the job stopped and
    exit 1, as if it had failed); the members exit with the worker's code."""
    net = hosts(3)  # type: ignore[operator]
    gate = tmp_path / "gate"
    gate.mkdir()
    port = free_port()
    args = [*c10d_args(net, port, "2:2"), "--max-restarts", "0",
            worker("hold_until_go.py"), str(gate), "1"]  # fmt: skip
    for i in (0, 1):
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    wait_for(lambda: {p.name for p in gate.iterdir()} == {"ready0", "ready1"}, 120, "round 0")
    spare = Node(net, 2, args, tmp_path, "spare")
    nodes.append(spare)
    wait_for(lambda: "is running without this node" in spare.stderr, 60, "the spare waiting")
    (gate / "go").touch()  # rank 1 exits 3
    assert [n.finish(timeout=120) for n in nodes[:2]] == [3, 3], nodes[0].stderr
    assert spare.finish(timeout=60) == 0, spare.stderr
    said = "the job ended while this node waited as a spare ("
    assert said in spare.stderr and "not needed, nothing to run" in spare.stderr, spare.stderr
    run_dir = next(spare.logs.iterdir())
    ends = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["outcome"] for e in ends if e["kind"] == "job_end"] == ["not_needed"], ends
    report = json.loads((run_dir / "report.json").read_text())  # written at every end
    assert (report["outcome"], report["root_cause"], report["attempts"]) == ("not_needed", None, 0)
    assert said in report["reason"], report
