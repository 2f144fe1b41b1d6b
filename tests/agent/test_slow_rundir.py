"""A run directory on a filesystem that answers every operation in 0.5 to 1 s (a struggling
NFS server: ``support/slowfs.py``) costs the job nothing on the paths where the agent
reacts: a peer's failure is followed by the restart round within seconds, and a SIGTERM
ends the node within its shutdown grace and the bounded time of its last writes, its
``report.json`` written. Real agents on loopback (c10d): the node on the slow mount, and a
node whose run directory is on the local disk, whose worker fails once and whose events
(on a disk that answers) time the restart."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from phalanx.agent.filewriter import END_WRITES
from phalanx.events import read_events
from phalanx.events.log import EVENTS_FILE
from phalanx.resources.ports import free_port
from support.hosts import Loopback, Node
from support.launch import wait_for, worker
from support.tools import slow_filesystem

HANG = 240.0  # bounds that only catch a hang (every file the slow node's worker opens: 1 s)
FAST = "heartbeat_interval=0.5,heartbeat_timeout=4,last_call_timeout=1,join_timeout=120"
SHUTDOWN = 3
PROMPT = 12.0  # the restart formed this long after the failure, at most (24 s before)
MARGIN = 20.0  # what the test's own polling and a loaded machine may add (ci55: 32.2 s against 28)


def test_a_slow_run_directory_holds_up_no_restart_and_no_stop(
    nodes: list[Node], tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    net, port = Loopback(), free_port()
    args = [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "slowdir", "--rdzv-conf", FAST,
        "--max-restarts", "1", "--shutdown-timeout", str(SHUTDOWN), "--cold-start",
        worker("fail_once_here.py"), str(marks),
    ]  # fmt: skip
    with slow_filesystem(tmp_path) as (mount, slowly):
        # (A later --log-dir wins over the one ``Node`` gives.)
        nodes.append(Node(net, 0, ["--log-dir", str(mount), *args], tmp_path, "slow"))
        nodes.append(Node(net, 1, args, tmp_path, "fast", env={"FAIL_HERE": "1"}))
        slow, fast = nodes
        wait_for(lambda: len(list(marks.glob("up.0.*"))) == 2, HANG, "the job's workers")
        slowly.touch()  # from now on every operation on the slow node's run directory: ~1 s
        (marks / "go").touch()  # the fast node's worker fails
        (run_dir,) = fast.logs.iterdir()
        wait_for(lambda: _formed(run_dir) is not None, HANG, "the restart round")
        failed, formed = _formed(run_dir) or (0.0, 0.0)
        assert formed - failed < PROMPT, (formed - failed, slow.stderr)
        began = time.monotonic()
        slow.proc.send_signal(signal.SIGTERM)  # while it starts its worker again
        code = slow.finish(HANG)
        took = time.monotonic() - began
        assert code == 128 + signal.SIGTERM, slow.stderr
        assert took < SHUTDOWN + END_WRITES + MARGIN, (took, slow.stderr)
        reports = list(mount.glob("*/report.json"))
        assert len(reports) == 1, slow.stderr  # written, however slowly, before the exit
        data = json.loads(reports[0].read_text())
        assert (data["outcome"], data["signal"]) == ("interrupted", "SIGTERM"), data
        assert fast.finish(HANG) == 128 + signal.SIGTERM, fast.stderr
        assert "Traceback" not in slow.stderr + fast.stderr


def _formed(run_dir: Path) -> tuple[float, float] | None:
    """(when the failure was, when the restart round formed) on the fast node's clock."""
    events = read_events(run_dir / EVENTS_FILE)
    failed = [e["t"] for e in events if e["kind"] == "failure"]
    formed = [e["t"] for e in events if e["kind"] == "rdzv_done" and e["round"] == 1]
    return (failed[0], formed[0]) if failed and formed else None
