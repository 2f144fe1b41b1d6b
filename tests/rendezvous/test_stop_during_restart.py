"""``phalanx stop`` (the real CLI) while the nodes are between rounds -- a worker failed, one
node waits for the job's verdict on the round while the other still stops its own worker
(which ignores SIGTERM for the shutdown grace), so no restart round has formed yet -- ends
every node as stopped: exit 143 and a ``report.json`` naming the signal on each, never the
failed round's exit code (issue 37, item 6). Stopped on the node that hosts the c10d store
and on the other one. Real agents on loopback (c10d).

The issue's "node B exits 3": the store's host is stopped while the other node's worker
outlasts the store's linger (``heartbeat_timeout``, 4 s here, within a shutdown grace of
20 s). That node heard the stop (``JOB_STOPPED``, with the signal) while it waited for its
worker, but it next asked the store, which had left with the stopped node: the job's
verdict on the round failed, and it ended with the failed round's report, exit 3."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.agent.stopped import asked_to_stop
from phalanx.rendezvous.api import EventKind, JobEvent
from phalanx.supervisor.group import Outcome, RoundResult
from support.hosts import Node
from support.stubborn import HANG, start_between_rounds

TERM = int(signal.SIGTERM)
STOPPED = JobEvent(EventKind.JOB_STOPPED, 0, "node 0 was stopped", {"signal": TERM})
GAVE_UP = JobEvent(EventKind.JOB_STOPPED, 0, "node 0 stopped the job")  # no signal: a failure
PEER = JobEvent(EventKind.PEER_FAILED, 0, "workers failed on node 0", {"returncode": 3})
LOST = JobEvent(EventKind.STORE_LOST, detail="connection refused")


@pytest.mark.parametrize(
    ("outcome", "event", "heard", "expected"),
    [
        (Outcome.FAILED, None, None, None),
        (Outcome.REMOTE, PEER, None, None),
        (Outcome.REMOTE, GAVE_UP, None, None),
        (Outcome.REMOTE, STOPPED, None, (TERM, STOPPED)),
        (Outcome.FAILED, None, STOPPED, (TERM, STOPPED)),  # its worker died with the peers
        (Outcome.REMOTE, PEER, STOPPED, (TERM, STOPPED)),
        (Outcome.REMOTE, LOST, STOPPED, (TERM, STOPPED)),  # the store left with the stop
        (Outcome.REMOTE, LOST, GAVE_UP, None),
    ],
)
def test_a_stop_heard_from_a_peer_ends_the_round_as_stopped(
    outcome: Outcome,
    event: JobEvent | None,
    heard: JobEvent | None,
    expected: tuple[int, JobEvent | None] | None,
) -> None:
    result = RoundResult(outcome, (), event)
    assert asked_to_stop(result, heard) == expected
    here = RoundResult(Outcome.INTERRUPTED, (), None, signum=int(signal.SIGINT))
    assert asked_to_stop(here, heard) == (signal.SIGINT, None)  # this node's own signal first


@pytest.mark.parametrize(
    ("stubborn", "grace"),
    [(1, 8), (0, 8), (1, 20)],
    ids=["stop-the-store-host", "stop-a-client", "the-store-host-leaves-first"],
)
def test_phalanx_stop_between_rounds_ends_every_node_143_with_a_report(
    stubborn: int, grace: int, nodes: list[Node], tmp_path: Path
) -> None:
    failed, _ = start_between_rounds(nodes, tmp_path, stubborn, grace, "stopping")
    failed_rank = 1 - stubborn  # its node's rank too: one worker per node
    (run_dir,) = failed.logs.iterdir()
    stop = subprocess.run(
        [sys.executable, "-m", "phalanx", "stop", str(run_dir)],
        capture_output=True, text=True, timeout=HANG, check=False,
    )  # fmt: skip
    assert stop.returncode == 0, stop.stderr
    codes = [n.finish(HANG) for n in nodes]
    said = "\n----\n".join(n.stderr for n in nodes)
    assert codes == [128 + signal.SIGTERM] * 2, said
    assert "Traceback" not in said and "restarting" not in said, said
    for node in nodes:
        (report,) = node.logs.glob("*/report.json")
        data = json.loads(report.read_text())
        assert (data["outcome"], data["signal"]) == ("interrupted", "SIGTERM"), data
        assert data["stopped_on_node"] == failed_rank, data
