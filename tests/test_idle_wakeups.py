"""An idle job costs its launcher next to nothing: on one node the agent's loop wakes about
once a second, not every monitor interval, and ``status.json`` is rewritten only when what it
says changes (the passing of time is no change). Real agents, real idle workers; the
mechanism is counted (the main thread's wake-ups from ``/proc``, the file's inode and mtime
over a window), never timed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from phalanx.status.service import WRITE_EVERY
from support.launch import launched, wait_for, worker

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
