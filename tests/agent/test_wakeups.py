"""The agent wakes when there is something to do, not on a timer: on one node its loop wakes
about once a second, not every monitor interval, and ``status.json`` is rewritten only when
what it says changes (the passing of time is no change); on several, a peer's event wakes it
at once, whatever the monitor interval. Real agents, real workers; the mechanism is counted
(the main thread's wake-ups from ``/proc``, the file's mtime over a window) or made the only
way to finish within a hang-catching timeout, never timed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from phalanx.resources.ports import free_port
from phalanx.status.service import WRITE_EVERY
from support.hosts import Node
from support.launch import launched, wait_for, worker
from support.multinode import c10d_args

WINDOW = 3 * WRITE_EVERY + 1.0  # seconds watched: several of the old rewrites would fall in it


def _run_dir(log_dir: Path) -> Path | None:
    found = [p.parent for p in log_dir.glob("*/status.json")]
    return found[0] if found else None


def _running(log_dir: Path) -> bool:
    run_dir = _run_dir(log_dir)
    if run_dir is None:
        return False
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return False  # between the rename and a reader: look again
    ranks = status.get("ranks") or []
    return status.get("state") == "running" and bool(ranks) and ranks[0]["state"] == "running"


def _wakeups(pid: int) -> int:
    """How often the agent's main thread has gone to sleep and woken since it started."""
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches for {pid}")


def _idle_job(tmp_path: Path) -> tuple[list[str], Path, Path]:
    marks, logs = tmp_path / "marks", tmp_path / "logs"
    marks.mkdir()
    args = ["--standalone", "--nproc-per-node", "1", "--log-dir", str(logs),
            worker("hold_until_go.py"), str(marks)]  # fmt: skip
    return args, marks, logs


def test_an_idle_jobs_status_file_is_rewritten_only_when_it_changes(tmp_path: Path) -> None:
    args, marks, logs = _idle_job(tmp_path)
    with launched(args) as agent:
        wait_for(lambda: (marks / "ready0").exists() and _running(logs), 60, "the worker running")
        run_dir = _run_dir(logs)
        assert run_dir is not None
        status = run_dir / "status.json"
        first = os.stat(status)
        until = time.monotonic() + WINDOW
        while time.monotonic() < until:  # watched, not slept: any rewrite shows at once
            now = os.stat(status)
            assert (now.st_ino, now.st_mtime_ns) == (first.st_ino, first.st_mtime_ns), (
                "status.json was rewritten while nothing in it changed"
            )
            time.sleep(0.1)
        (marks / "go").touch()  # the worker ends: that is a change, written at once
        _, err = agent.communicate(timeout=60)
        assert agent.returncode == 0, err
    final = json.loads(status.read_text())
    assert final["state"] == "succeeded" and final["ranks"][0]["state"] == "exited"
    assert os.stat(status).st_mtime_ns != first.st_mtime_ns  # (an inode number may be reused)


def test_an_idle_single_node_agent_wakes_about_once_a_second(tmp_path: Path) -> None:
    """One node, no stall timeout: nothing to poll for, so the loop ticks once a second
    (the monitor interval, 0.1 s, would be about ten wake-ups a second)."""
    args, marks, logs = _idle_job(tmp_path)
    with launched(args) as agent:
        wait_for(lambda: (marks / "ready0").exists() and _running(logs), 60, "the worker running")
        before, began = _wakeups(agent.pid), time.monotonic()
        wait_for(lambda: time.monotonic() - began >= 5.0, 30, "the window to pass")
        woke = _wakeups(agent.pid) - before
        seconds = time.monotonic() - began
        (marks / "go").touch()
        _, err = agent.communicate(timeout=60)
        assert agent.returncode == 0, err
    # A count, not a timing: at ten a second this is over 10 x seconds; at one a second, a
    # few x seconds even with the scheduler's extra switches on a loaded machine.
    assert woke <= 4 * seconds, f"the agent's loop woke {woke} times in {seconds:.1f} s"


def test_a_peers_failure_wakes_the_other_agent_at_once(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """A monitor interval of 10 minutes: the node whose worker did not fail would poll the
    rendezvous only then; the peer's event, posted to the store, wakes its watch thread and
    its loop, so it stops its worker and the job ends now (the wait below only catches a
    hang)."""
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    for i in (0, 1):
        args = [*c10d_args(net, port, "2"), "--monitor-interval", "600", "--max-restarts", "0",
                worker("fail_rank.py"), "1", "3"]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    codes = [node.finish(timeout=120) for node in nodes]
    assert codes == [3, 3], [node.stderr[-2000:] for node in nodes]
    assert any("stopped local workers" in node.stderr for node in nodes)
