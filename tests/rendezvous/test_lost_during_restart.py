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
from support.hosts import Node
from support.stubborn import HANG, start_between_rounds


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
    failed, left = start_between_rounds(nodes, tmp_path, 1 - failing_rank, 8, "lost")
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
    failed, _ = start_between_rounds(nodes, tmp_path, 0, 60, "lost")
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
