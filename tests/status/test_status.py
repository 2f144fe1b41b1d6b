"""``phalanx status``, ``logs``, ``stop`` and ``ls`` on real jobs: a running two-node job seen
from either node (every node's ranks and steps, through the store), stopped from one node
(every process gone on both, both reports written, both agents 143); a finished run shown
from its files; bad input one line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from phalanx.events import read_events, read_run_events
from phalanx.resources.ports import free_port
from support.hosts import Loopback, Node
from support.launch import PHALANX, alive, launched, run_phalanx, wait_for, worker

FAST = "heartbeat_interval=0.5,heartbeat_timeout=4,last_call_timeout=1,join_timeout=60"


def _status(run_dir: Path) -> dict[str, object]:
    done = run_phalanx(["status", str(run_dir), "--json"], timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _steps(view: dict[str, object]) -> dict[int, int]:
    """Global rank -> its step, across every node in ``view``."""
    return {
        rank["rank"]: rank["step"]
        for node in view["nodes"]  # type: ignore[attr-defined]
        for rank in node["ranks"]
        if rank["step"] is not None
    }


def _stepping(run_dir: Path) -> bool:
    """Whether this node's own status file shows a step of one of its ranks."""
    status = json.loads((run_dir / "status.json").read_text())
    return any(rank["step"] is not None for rank in status["ranks"])


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return not alive(pid)  # a zombie not yet reaped by its new parent


@pytest.mark.parametrize("stopped", ["store host", "store client"])
def test_status_logs_stop_and_ls_of_a_two_node_job(
    nodes: list[Node], tmp_path: Path, stopped: str
) -> None:
    """Agent 0 runs two ranks, agent 1 one (c10d, loopback); ``phalanx stop`` on the agent
    that serves the rendezvous store, or on the other one, stops both."""
    net = Loopback()
    endpoint = f"127.0.0.1:{free_port()}"
    for i, nproc in ((0, "2"), (1, "1")):
        args = ["--nnodes", "2", "--nproc-per-node", nproc, "--rdzv-backend", "c10d",
                "--rdzv-endpoint", endpoint, "--rdzv-id", "watch", "--rdzv-conf", FAST,
                worker("steps_slowly.py"), "600"]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    wait_for(lambda: all(any(n.logs.glob("*/status.json")) for n in nodes), 90, "both agents")
    run_dirs = [next(n.logs.iterdir()) for n in nodes]
    wait_for(lambda: all(_stepping(d) for d in run_dirs), 90, "steps on both nodes")
    # The rendezvous gives the node ranks: the agent with two workers may be node 1.
    own = [json.loads((d / "status.json").read_text()) for d in run_dirs]
    ranks_of = {s["node"]: [r["rank"] for r in s["ranks"]] for s in own}
    assert sorted(ranks_of) == [0, 1] and len(ranks_of[own[0]["node"]]) == 2
    assert sorted(ranks_of[0] + ranks_of[1]) == [0, 1, 2]
    for asker in (0, 1):  # either node's status shows both nodes, both moving
        first = _status(run_dirs[asker])
        assert first["state"] == "running" and first["missing"] == [], first
        assert first["this_node"] == own[asker]["node"]
        assert [n["node"] for n in first["nodes"]] == [0, 1]
        assert [[r["rank"] for r in n["ranks"]] for n in first["nodes"]] == [
            ranks_of[0], ranks_of[1],
        ]  # fmt: skip
        assert all(r["state"] == "running" for n in first["nodes"] for r in n["ranks"])
        before = _steps(first)

        def moved(asker: int = asker, before: dict[int, int] = before) -> bool:
            later = _steps(_status(run_dirs[asker]))
            return sorted(later) == [0, 1, 2] and all(later[r] > s for r, s in before.items())

        wait_for(moved, 60, "every rank's step to move, as seen from one node")
        text = run_phalanx(["status", str(run_dirs[asker])], timeout=60)
        assert text.returncode == 0, text.stderr
        rows = [line.split() for line in text.stdout.splitlines() if re.match(r"^[01] ", line)]
        assert sorted((int(row[0]), row[2], int(row[3])) for row in rows) == sorted(
            (node, "running", rank) for node in (0, 1) for rank in ranks_of[node]
        ), text.stdout
        other = 1 - own[asker]["node"]  # its events came through the store
        copied = read_events(run_dirs[asker] / "nodes" / str(other) / "events.jsonl")
        assert any(e["kind"] == "workers_started" for e in copied)
        assert {e["node"] for e in read_run_events(run_dirs[asker])} - {None} == {0, 1}
        drawn = run_phalanx(["timeline", str(run_dirs[asker])], timeout=60)  # it reads them too
        assert "3 rank(s) on" in drawn.stdout.splitlines()[0], drawn.stdout + drawn.stderr

    shown, hidden = ranks_of[own[0]["node"]][1], ranks_of[own[0]["node"]][0]  # agent 0's two
    logs = run_phalanx(["logs", str(run_dirs[0]), "--rank", str(shown)], timeout=30)
    assert logs.returncode == 0, logs.stderr
    assert f"rank {shown} step 0" in logs.stdout
    assert f"==> attempt_0/rank_{shown}/stdout.log <==" in logs.stdout
    assert f"rank {hidden} " not in logs.stdout and f"rank_{hidden}" not in logs.stdout
    listed = run_phalanx(["ls", "--log-dir", str(nodes[0].logs)], timeout=30)
    assert listed.stdout.splitlines()[1].split()[:2] == [run_dirs[0].name, "running"]

    follow = subprocess.Popen(
        [*PHALANX, "logs", str(run_dirs[0]), "--follow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    # Every process of the job, on both nodes: agents, templates, workers.
    job = [n.proc.pid for n in nodes]
    job += [c.pid for n in nodes for c in psutil.Process(n.proc.pid).children(recursive=True)]
    client = [i for i, n in enumerate(nodes) if "connecting as a client" in n.stderr]
    assert len(client) == 1, nodes[0].stderr + nodes[1].stderr
    stopper = client[0] if stopped == "store client" else 1 - client[0]
    stop = run_phalanx(["stop", str(run_dirs[stopper])], timeout=150)
    assert stop.returncode == 0, stop.stderr
    assert "the job stopped; report:" in stop.stderr
    assert [n.finish(60) for n in nodes] == [143, 143], nodes[0].stderr + nodes[1].stderr
    wait_for(lambda: all(_gone(pid) for pid in job), 20, "every process of the job to end")
    for i, run_dir in enumerate(run_dirs):
        report = json.loads((run_dir / "report.json").read_text())
        assert (report["outcome"], report["signal"], report["root_cause"]) == (
            "interrupted", "SIGTERM", None,
        )  # fmt: skip
        assert report["stopped_on_node"] == own[stopper]["node"]
        end = read_events(run_dir / "events.jsonl")[-1]
        assert (end["kind"], end["outcome"], end["exit_code"]) == ("job_end", "interrupted", 143)
        assert not any(e["kind"] == "failure" for e in read_events(run_dir / "events.jsonl"))
        final = _status(run_dir)  # from its files now
        assert final["state"] == "interrupted" and final["alive"] is False, i
    listed = run_phalanx(["ls", "--log-dir", str(nodes[0].logs)], timeout=30)
    assert listed.stdout.splitlines()[1].split()[:2] == [run_dirs[0].name, "interrupted"]
    try:  # --follow ended with the run, having printed each rank's last line
        out, err = follow.communicate(timeout=30)
    finally:
        if follow.poll() is None:
            os.killpg(follow.pid, signal.SIGKILL)
            follow.communicate()
    assert follow.returncode == 0, err
    for rank in ranks_of[own[0]["node"]]:
        last = (run_dirs[0] / "attempt_0" / f"rank_{rank}" / "stdout.log").read_text()
        assert last.splitlines()[-1] + "\n" in out, rank


def test_a_finished_run_shows_its_final_state_and_root_cause(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = run_phalanx(["--nproc-per-node", "2", "--log-dir", str(logs),
                        worker("steps_then_fail.py"), "6", "1", "2"])  # fmt: skip
    assert done.returncode == 3, done.stderr
    (run_dir,) = logs.iterdir()
    view = _status(run_dir)
    assert (view["state"], view["alive"]) == ("failed", False)
    (node,) = view["nodes"]
    assert node["exit_code"] == 3 and node["outcome"] == "failed"
    states = {r["rank"]: (r["state"], r["step"]) for r in node["ranks"]}
    assert states[1] == ("failed", 2)  # its exact last step
    assert states[0][0] == "exited"
    assert node["last_failure"]["rank"] == 1 and node["last_failure"]["failure_kind"] == "exit_code"
    text = run_phalanx(["status", str(run_dir)], timeout=30).stdout
    assert text.startswith(f"run {node['run_id']}: failed (exit code 3);"), text
    assert "last failure: round 0, rank 1 (node 0) [exit_code]:" in text
    assert "root cause: rank 1 on " in text
    # The recovery figures of its events: one incident, never recovered, and no restart:
    # nothing was recovered from, so no incident line (the figures are in the JSON).
    assert "recovery: incident" not in text, text
    (incident,) = view["recovery"]["incidents"]
    # Rank 0 may be one step past rank 1's failure before it is stopped: the round's peak.
    assert incident["target"] in ("step 2", "step 3") and not incident["recovered"]
    assert view["report"]["root_cause"]["rank"] == 1 and view["missing"] == []
    listed = run_phalanx(["ls", "--log-dir", str(logs)], timeout=30)
    assert listed.returncode == 0
    assert listed.stdout.splitlines()[0].split() == ["RUN", "STATE", "STARTED", "DURATION"]
    assert listed.stdout.splitlines()[1].split()[:2] == [run_dir.name, "failed"]


def test_stop_never_signals_a_process_that_reused_the_agents_pid(tmp_path: Path) -> None:
    """A ``launcher.json`` naming a live process that started at another time: refused."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    me = psutil.Process()
    (run_dir / "launcher.json").write_text(
        json.dumps({"pid": me.pid, "host": os.uname().nodename, "started": me.create_time() - 60})
    )
    done = run_phalanx(["stop", str(run_dir)], timeout=30)
    assert done.returncode == 1
    assert f"is not running (its agent, pid {me.pid}, ended)" in done.stderr
    assert run_phalanx(["status", str(run_dir), "--json"]).returncode == 0  # read, not asked


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "not a run"
    empty.mkdir()
    for argv in (
        ["status", str(empty)],
        ["logs", str(empty)],
        ["stop", str(empty)],
        ["status"],
        ["logs", str(tmp_path), "--rank", "one"],
        ["ls", "--log-dir", str(tmp_path / "missing")],
        ["status", str(empty), "--bogus"],
    ):
        done = run_phalanx(argv, timeout=30)
        assert done.returncode == 2, (argv, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr, argv
    assert "is not a phalanx run directory" in run_phalanx(["status", str(empty)]).stderr
    for name in ("status", "logs", "stop", "ls"):
        helped = run_phalanx([name, "--help"], timeout=30)
        assert helped.returncode == 0 and f"usage: phalanx {name}" in helped.stdout


def test_ls_lists_the_newest_run_first_with_its_state(tmp_path: Path) -> None:
    """From the files alone: a run that ended well, and one whose agent died without a word
    (no job_end, its pid gone); anything else under the directory is not a run."""

    def run(name: str, start: float, *end: dict[str, object]) -> None:
        events = [{"v": 1, "kind": "run_start", "t": start, "run_id": name, "pid": 1}, *end]
        (tmp_path / name).mkdir()
        (tmp_path / name / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))

    run("old", 1_000_000.0, {"v": 1, "kind": "job_end", "t": 1_000_090.0,
                              "outcome": "succeeded", "exit_code": 0})  # fmt: skip
    run("new", 2_000_000.0)
    (tmp_path / "not-a-run").mkdir()
    listed = run_phalanx(["ls", "--log-dir", str(tmp_path)], timeout=30)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert [(r[0], r[1], r[-1]) for r in rows] == [("new", "ended", rows[0][-1]),
                                                  ("old", "succeeded", "0:01:30")]  # fmt: skip
    for n in range(50):  # the 50 newest are listed, --all lists every one
        run(f"more{n:02d}", 3_000_000.0 + n)
    shown = run_phalanx(["ls", "--log-dir", str(tmp_path)], timeout=30).stdout.splitlines()[1:]
    assert len(shown) == 50 and shown[0].split()[0] == "more49"
    every = run_phalanx(["ls", "--log-dir", str(tmp_path), "--all"], timeout=30)
    assert [line.split()[0] for line in every.stdout.splitlines()[-2:]] == ["new", "old"]


def test_status_and_stop_of_a_node_waiting_for_its_peers(tmp_path: Path) -> None:
    """One agent of two, the other never comes: no tick answers the request (the command
    says so and shows the file), and ``stop`` still ends it with 143 and a report."""
    logs = tmp_path / "logs"
    args = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}", "--rdzv-id", "alone", "--rdzv-conf", "join_timeout=300",
            "--log-dir", str(logs), worker("steps_slowly.py"), "1"]  # fmt: skip
    with launched(args) as agent:
        wait_for(lambda: any(logs.glob("*/status.json")), 60, "the agent's status file")
        (run_dir,) = logs.iterdir()
        done = run_phalanx(["status", str(run_dir), "--json", "--timeout", "1"], timeout=60)
        view = json.loads(done.stdout)
        assert (view["state"], view["alive"]) == ("rendezvous", True), view
        assert "did not answer within 1 s" in view["note"]
        assert list((run_dir / "requests").iterdir()) == []  # the command cleans up after itself
        stop = run_phalanx(["stop", str(run_dir)], timeout=60)
        assert stop.returncode == 0, stop.stderr
        assert agent.wait(60) == 143
    report = json.loads((run_dir / "report.json").read_text())
    assert report["outcome"] == "interrupted"
    assert report["reason"] == "stopped by SIGTERM on this node, in the rendezvous"


def test_stop_is_a_stop_even_where_sigterm_means_a_preemption(tmp_path: Path) -> None:
    """``--preempt-signals SIGTERM`` (as under SLURM or Kubernetes): a scheduler's SIGTERM
    would start a preemption (exit 75); ``phalanx stop``'s is a stop (143, no grace)."""
    logs = tmp_path / "logs"
    args = ["--preempt-signals", "SIGTERM", "--preempt-grace", "300", "--nproc-per-node", "1",
            "--log-dir", str(logs), worker("steps_slowly.py"), "3000"]  # fmt: skip
    with launched(args) as agent:
        wait_for(lambda: any(logs.glob("*/status.json")), 60, "the agent's status file")
        (run_dir,) = logs.iterdir()
        wait_for(lambda: _stepping(run_dir), 60, "the first step")
        stop = run_phalanx(["stop", str(run_dir)], timeout=60)
        assert stop.returncode == 0, stop.stderr
        _, err = agent.communicate(timeout=60)
        assert agent.returncode == 143, err
    assert json.loads((run_dir / "report.json").read_text())["outcome"] == "interrupted"
    kinds = [e["kind"] for e in read_events(run_dir / "events.jsonl")]
    assert "preempt" not in kinds and kinds[-1] == "job_end"
