"""A node that lost the store, or fenced itself, comes back while the restart budget allows
(docs/explanation/design.md, "Fencing"): two real agents on loopback with the c10d store hosted by node 0's
agent, whose process is paused (SIGSTOP) for 9 s -- longer than the 8 s after which a node
fences itself with the default settings. Node 1 fences (its worker SIGKILLed), waits for the
store, rejoins as a new member, and the job re-forms and finishes (a node cut off, and no
restart left: ``tests/rendezvous/test_fence_rejoin.py``). The store host fences as it wakes:
a job of 2 never fails over, so it serves on and rejoins as a new member too -- whichever its
agent read first, the fence or its rank's exit (a Gloo error: node 1's rank was killed during
the pause; read first, it once ended the job under load). The store host's recovery figures
count the pause: its incident begins where its agent last saw the ranks move, before it was
stopped (it was from the failure it noticed after, "0.43 s down").
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

from phalanx.resources.ports import free_port
from support.hosts import Loopback, Node
from support.launch import wait_for, worker

HANG = 180.0
PAUSE = 9.0  # the store host held: > fence_after (8 s: heartbeat_timeout 10 - 1 - 1)


def _start(nodes: list[Node], tmp_path: Path, shared: Path, max_restarts: int) -> None:
    port = free_port()
    for i in (0, 1):
        args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "rejoin",
                "--rdzv-conf", f"is_host={'true' if i == 0 else 'false'}",
                "--max-restarts", str(max_restarts), worker("lossy_steps.py"), str(shared),
                "beat"]  # fmt: skip
        nodes.append(Node(Loopback(), i, args, tmp_path, f"n{i}"))


def _pause_the_store_host(nodes: list[Node], shared: Path) -> None:
    """Once both ranks step, hold node 0's agent (the store's host) for ``PAUSE`` seconds."""

    def stepping() -> bool:
        for node in nodes:
            assert node.proc.poll() is None, node.stderr
        return {p.name for p in shared.glob("r*-0.steps")} == {"r0-0.steps", "r1-0.steps"}

    wait_for(stepping, HANG, "both ranks to step")
    os.kill(nodes[0].proc.pid, signal.SIGSTOP)
    try:
        time.sleep(PAUSE)  # the fault's length, not a wait for a condition
    finally:
        os.kill(nodes[0].proc.pid, signal.SIGCONT)


def test_a_paused_store_host_re_forms_the_job_with_the_node_that_fenced(
    nodes: list[Node], tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    _start(nodes, tmp_path, shared, max_restarts=2)
    _pause_the_store_host(nodes, shared)
    try:
        wait_for(lambda: any(shared.glob("r*-1.steps")), HANG, "a round after the pause to step")
    except AssertionError as timed_out:  # say what each agent did (seen once under load)
        raise AssertionError(f"{timed_out}\n--- node 0:\n{nodes[0].stderr[-3000:]}"
                             f"\n--- node 1:\n{nodes[1].stderr[-3000:]}") from None  # fmt: skip
    (shared / "stop").write_text("")
    codes = [node.finish(HANG) for node in nodes]
    assert codes == [0, 0], (nodes[0].stderr, nodes[1].stderr)
    for node in nodes:  # the store host fenced too: it serves on, and rejoins its own job
        err = node.stderr
        assert "fenced: no store write confirmed this node alive" in err, err
        assert "rejoining as a new member" in err, err
    for node in nodes:  # both ranks finished in the re-formed job, after one restart
        assert "ok world=2" in node.stdout and "restart=0" not in node.stdout, node.stdout
    # The store host's agent was stopped PAUSE s with its ranks' last progress seen before:
    # the incident is down from there to the re-formed round's first progress.
    (report,) = nodes[0].logs.glob("*/report.json")
    (incident,) = json.loads(report.read_text())["recovery"]["incidents"]
    assert incident["recovered"] and incident["downtime"] >= PAUSE, incident
    assert incident["detect"] >= PAUSE, incident
    assert re.search(r"recovery: incident 1 .* after \d+\.\d\d s down", nodes[0].stderr)
