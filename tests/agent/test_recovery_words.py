"""The recovery lines and figures through the real CLI and real agents: which node they
name, the restart count, figures on each node's own monotonic clock (a wall clock stepped
or skewed by the LD_PRELOAD shim, ``support.skew``), no lines for a job that had nothing to
recover from, "back" after a script whose beats count from 0 again, the crash-loop detail."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from phalanx.events import read_events
from phalanx.resources.ports import free_port
from support.hosts import Node
from support.launch import launched, run_phalanx, wait_for, worker
from support.multinode import c10d_args
from support.skew import skewed_env, stepping_env

HOUR = 3600


def _report(logs: Path) -> dict[str, Any]:
    (path,) = logs.glob("*/report.json")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _events(logs: Path) -> list[dict[str, Any]]:
    (path,) = logs.glob("*/events.jsonl")
    return read_events(path)


def test_the_lines_name_the_failing_node_and_count_restarts_apart_from_re_forms(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """Node 0 starts alone, node 1 joins (a re-form, no restart), rank 1 on node 1 fails
    (restart 1 of 1, the rendezvous's count), the job succeeds. Node 0's recovery line names
    node 1 as where rank 1 failed, not itself; node 1's names itself."""
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    args = [
        *c10d_args(net, port, "1:2"), "--max-restarts", "1",
        worker("reform_then_fail.py"), str(tmp_path),
    ]  # fmt: skip
    nodes.append(Node(net, 0, args, tmp_path, "n0"))
    wait_for(lambda: (tmp_path / "alone").exists(), 90, "node 0 to start alone after the last call")
    nodes.append(Node(net, 1, args, tmp_path, "n1"))
    assert [n.finish() for n in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    first, second = nodes
    events = _events(first.logs)
    assert [e["restart"] for e in events if e["kind"] == "restart"] == [1], events
    assert [e["kind"] for e in events].count("reform") == 1
    assert "restarting the worker group (restart 1 of 1; 1 re-form(s) for joining nodes)" in (
        first.stderr
    ), first.stderr
    assert re.search(
        r"recovery: incident 1 \(round \d+\), rank 1 \S+ on node 1 \(as seen on \S+ \(node 0\)\)",
        first.stderr,
    ), first.stderr
    assert re.search(
        r"recovery: incident 1 \(round \d+\), rank 1 \S+ on \S+ \(node 1\): ", second.stderr
    ), second.stderr


def test_a_clock_step_changes_no_figure(tmp_path: Path) -> None:
    """The agent's wall clock steps an hour back between the restart and the job's end: the
    figures are still there (ETTR, the run's length), as on the monotonic clock."""
    skew_file = tmp_path / "skew"
    env = stepping_env(tmp_path / "shim", skew_file)
    logs = tmp_path / "logs"
    args = ["--nproc-per-node", "1", "--max-restarts", "1", "--log-dir", str(logs),
            worker("fail_then_wait.py"), str(tmp_path)]  # fmt: skip
    with launched(args, env={**os.environ, **env}) as job:
        wait_for(lambda: (tmp_path / "running").exists(), 90, "the second attempt to run")
        wait_for(
            lambda: any(e["kind"] == "progress" and e["round"] == 1 for e in _events(logs)),
            60, "the second attempt's progress in the events",
        )  # fmt: skip
        skew_file.write_text(f"-{HOUR}\n")
        (tmp_path / "go").touch()
        _, err = job.communicate(timeout=120)
    assert job.returncode == 0, err
    events = _events(logs)
    assert events[-1]["t"] < events[0]["t"], "the wall clock did not step"
    figures = _report(logs)["recovery"]
    (node,) = figures["nodes"]
    assert figures["ettr"] is not None and 0 < node["wall"] < 600, figures
    assert re.search(r"recovery: ETTR 0\.\d\d ", err), err


def test_status_on_a_host_an_hour_ahead_measures_on_the_monotonic_clock(tmp_path: Path) -> None:
    """``phalanx status`` run with its wall clock an hour ahead of the agent's: the running
    node's wall time is the run's, not an hour."""
    logs = tmp_path / "logs"
    args = ["--nproc-per-node", "1", "--log-dir", str(logs), worker("step_then_wait.py"),
            str(tmp_path)]  # fmt: skip
    with launched(args) as job:
        wait_for(lambda: (tmp_path / "ready").exists(), 90, "the worker's first step")
        (run_dir,) = logs.glob("*/")
        wait_for(
            lambda: any(e["kind"] == "progress" for e in _events(logs)), 60, "a progress event"
        )
        done = run_phalanx(
            ["status", str(run_dir), "--json"],
            env={**os.environ, **skewed_env(tmp_path / "shim", HOUR)},
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        (node,) = json.loads(done.stdout)["recovery"]["nodes"]
        assert 0 < node["wall"] < 600 and node["ettr"] is not None, node
        assert job.poll() is None  # still running: ``now`` was used (``launched`` ends it)


def test_a_failed_job_without_restarts_prints_no_recovery_lines(tmp_path: Path) -> None:
    """Nothing was recovered from: no incident or ETTR line (report.json keeps the figures)."""
    logs = tmp_path / "logs"
    done = run_phalanx(
        ["--standalone", "--no-python", "--log-dir", str(logs), "sh", "-c", "exit 3"]
    )
    assert done.returncode == 3, done.stderr
    assert "recovery:" not in done.stderr and "ETTR" not in done.stderr, done.stderr
    assert len(_report(logs)["recovery"]["incidents"]) == 1


def test_back_after_a_resume_is_progress_in_the_new_attempt(tmp_path: Path) -> None:
    """A script that reports no step (beats only) beats 8 times and fails; resumed, it beats
    twice (its beats count from 0 again) and finishes: back at its first beat, not at 8."""
    logs = tmp_path / "logs"
    done = run_phalanx(
        ["--nproc-per-node", "1", "--max-restarts", "1", "--log-dir", str(logs),
         worker("beats_then_fail.py"), "8"],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (incident,) = _report(logs)["recovery"]["incidents"]
    assert incident["recovered"] is True and incident["target"] is None, incident
    assert "recovery: incident 1 (round 0), rank 0 exit_code on" in done.stderr, done.stderr
    assert ": making progress again after " in done.stderr, done.stderr
    assert "beats" not in done.stderr


def test_a_crash_loop_of_a_silent_worker_has_no_empty_detail(tmp_path: Path) -> None:
    """A worker killed by SIGKILL twice with nothing on stderr: the crash-loop line ends at
    how it died, not in ": )"."""
    logs = tmp_path / "logs"
    done = run_phalanx(
        ["--standalone", "--no-python", "--max-restarts", "3", "--log-dir", str(logs),
         "sh", "-c", "kill -9 $$"],
    )  # fmt: skip
    assert "crash loop: the same failure twice in a row (rank 0, killed by SIGKILL) " in (
        done.stderr
    ), done.stderr
    assert ": )" not in done.stderr
    assert _report(logs)["crash_loop"] is True


def _stamps(folder: Path, rank: int, restart: int) -> dict[int, float]:
    """The monotonic time each step of ``stamped_steps.py`` was made at, by step."""
    lines = (folder / f"r{rank}-{restart}.stamps").read_text().split()
    return {int(step): float(at) for step, at in zip(lines[::2], lines[1::2], strict=True)}


def test_a_short_run_counts_its_steps_to_the_agents_reading(tmp_path: Path) -> None:
    """Two ranks step every 0.3 s for under 2 s (the progress samples' interval) and fail
    at step 5; the restarted round steps past it and finishes. Each figure is where the
    workers' own stamps put it, to the agent's reading of the counters (a progress event's
    ``age``: its previous reading), never in the job's favour: startup ends at the first
    step, the incident runs from the last step before the failure to step 5 again. (It was
    "ETTR 0.0x": the first progress and "back" were taken at the 2 s samples, here at the
    failure and near the job's end.)"""
    logs = tmp_path / "logs"
    done = run_phalanx(
        ["--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(logs),
         worker("stamped_steps.py"), str(tmp_path), "8", "5"],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    events = _events(logs)
    progress = [e for e in events if e["kind"] == "progress"]
    first = next(e for e in progress if e["round"] == 0)
    last = [e for e in progress if e["round"] == 0][-1]
    back = next(e for e in progress if e["round"] == 1 and e["step"] >= 5)
    began = events[0]["mono"]
    stamped = {
        "startup": min(_stamps(tmp_path, r, 0)[0] for r in (0, 1)) - began,
        "downtime": min(_stamps(tmp_path, r, 1)[5] for r in (0, 1))
        - max(_stamps(tmp_path, r, 0)[5] for r in (0, 1)),
    }
    slack = {"startup": first["age"], "downtime": last["age"] + back["age"]}
    (node,) = _report(logs)["recovery"]["nodes"]
    (incident,) = _report(logs)["recovery"]["incidents"]
    figures = {"startup": node["startup"], "downtime": incident["downtime"]}
    for name, value in figures.items():  # the agent saw it happen between two readings
        assert stamped[name] - 0.01 <= value <= stamped[name] + slack[name] + 0.01, (
            name, value, stamped[name], slack[name], events,
        )  # fmt: skip
    assert node["productive"] > 0 and node["ettr"] > 0, node
    assert re.search(r"recovery: ETTR 0\.\d\d ", done.stderr), done.stderr
