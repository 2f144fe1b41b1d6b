"""A job whose restart round cannot form still ends with its report, on the node left: a
worker fails on one node (exit 3), that node's agent is SIGKILLed (its whole session) after
it told the job, and the other node -- still stopping its own worker, which ignores SIGTERM
-- then finds no round to restart into. Its report names the first failure as the root cause
and says why the job ended; "restarting" is never said for a round that never formed. A
node asked to stop while it waits for the others before a restart ends as stopped (143),
with its report. Real agents on loopback (c10d)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from phalanx.events import read_events
from phalanx.events.log import EVENTS_FILE
from phalanx.net import free_port
from support.hosts import Loopback, Node
from support.launch import wait_for, worker

HANG = 90.0
FAST = "heartbeat_interval=0.5,heartbeat_timeout=4,last_call_timeout=1,join_timeout=30"
FAILED = "exit code 3 (attempt 0)"  # numbered as its directory, attempt_0


def _start(nodes: list[Node], tmp_path: Path, stubborn: int, shutdown: int) -> tuple[Node, Node]:
    """Two agents; rank ``stubborn`` ignores SIGTERM (for ``shutdown`` seconds), the other
    rank exits 3. Returns (the node whose worker failed, the other) once the failure was
    told and the other node began to stop its worker."""
    marks = tmp_path / "marks"
    marks.mkdir()
    net, port = Loopback(), free_port()
    args = [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "lost", "--rdzv-conf", FAST,
        "--max-restarts", "3", "--shutdown-timeout", str(shutdown), "--cold-start",
        worker("stubborn_then_fail.py"), str(marks), str(stubborn),
    ]  # fmt: skip
    for i in (0, 1):
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    wait_for(lambda: any(FAILED in n.stderr for n in nodes), HANG, "a worker to fail")
    # The other node heard of it: it is stopping its worker (which ignores the SIGTERM).
    wait_for((marks / "sigterm").exists, HANG, "the other node to stop its worker")
    failed = next(n for n in nodes if FAILED in n.stderr)
    return failed, next(n for n in nodes if n is not failed)


def _report(node: Node) -> dict[str, object]:
    (path,) = node.logs.glob("*/report.json")
    data: dict[str, object] = json.loads(path.read_text())
    return data


def _job_end(node: Node) -> dict[str, object]:
    (run_dir,) = node.logs.iterdir()
    return read_events(run_dir / EVENTS_FILE)[-1]


@pytest.mark.parametrize("lost", ["store-host", "client"])
def test_a_node_lost_before_the_restart_round_keeps_the_root_cause(
    lost: str, nodes: list[Node], tmp_path: Path
) -> None:
    failing_rank = 0 if lost == "store-host" else 1  # node 0 hosts the store, runs rank 0
    failed, left = _start(nodes, tmp_path, stubborn=1 - failing_rank, shutdown=8)
    failed.kill()  # SIGKILL to its whole session: the agent and all it started
    code = left.finish(HANG)
    stderr = left.stderr
    assert code == 3, stderr
    assert "Traceback" not in stderr, stderr
    assert "restarting" not in stderr, stderr  # no round formed to restart into
    assert "the restart round could not form" in stderr, stderr
    report = _report(left)
    cause = report["root_cause"]
    assert isinstance(cause, dict), report
    assert (cause["rank"], cause["returncode"]) == (failing_rank, 3), cause
    ended = report["ended"]
    assert isinstance(ended, str) and "the restart round could not form" in ended, report
    if lost == "client":  # the store's host counts the nodes: it says one is gone
        assert "only 1 node(s) are left" in ended, report
    end = _job_end(left)
    assert (end["kind"], end["outcome"], end["exit_code"]) == ("job_end", "failed", 3), end


def test_a_node_stopped_while_waiting_to_restart_reports_and_ends_143(
    nodes: list[Node], tmp_path: Path
) -> None:
    # Rank 1 fails; its node then waits for node 0's verdict on the round, which comes only
    # once node 0 has stopped its SIGTERM-ignoring worker (60 s): it is stopped meanwhile.
    failed, _ = _start(nodes, tmp_path, stubborn=0, shutdown=60)
    failed.proc.send_signal(signal.SIGTERM)  # what phalanx stop sends
    code = failed.finish(HANG)
    stderr = failed.stderr
    assert code == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr and "restarting" not in stderr, stderr
    report = _report(failed)
    assert (report["outcome"], report["signal"]) == ("interrupted", "SIGTERM"), report
    cause = report["root_cause"]
    assert isinstance(cause, dict) and (cause["rank"], cause["returncode"]) == (1, 3), report
    end = _job_end(failed)
    assert (end["kind"], end["outcome"], end["exit_code"]) == ("job_end", "interrupted", 143), end
