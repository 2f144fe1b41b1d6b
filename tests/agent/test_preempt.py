"""Preemption: a signal that means "you will be stopped" reaches every rank on every node,
the ranks save the same step, the job exits 75 and resumes bit-identically (real agents,
real Gloo, real signals)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from phalanx.errors import REQUEUE_EXIT_CODE
from phalanx.resources.ports import free_port
from support.hosts import Loopback, NamespaceHosts, Node
from support.launch import PHALANX, alive, end_all, read_pids, start_tree, wait_for, worker

Hosts = Loopback | NamespaceHosts
FAST = "heartbeat_interval=0.5,heartbeat_timeout=4,last_call_timeout=1,join_timeout=60,exit_barrier_timeout=60"
STEPS, HOLD_AT = 12, 5


def _fake_scontrol(directory: Path) -> Path:
    """A stand-in for Slurm's scontrol that records each call's argv as a line."""
    directory.mkdir()
    calls = directory / "calls"
    script = directory / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return calls


def _job(
    net: Hosts,
    tmp_path: Path,
    nodes: list[Node],
    name: str,
    out: Path,
    flags: Sequence[str] = (),
    script_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> list[Node]:
    """Two agents (one worker each) of ``preempt_train.py`` writing into ``out``."""
    port = free_port()
    out.mkdir(exist_ok=True)
    started = []
    for i in range(2):
        args = [
            "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{net.addr(0)}:{port}", "--rdzv-id", name, "--rdzv-conf", FAST,
            *flags, worker("preempt_train.py"), str(out), str(STEPS), *script_args,
        ]  # fmt: skip
        started.append(Node(net, i, args, tmp_path, f"{name}{i}", env=env))
    nodes.extend(started)
    return started


def test_two_nodes_save_the_same_step_exit_75_and_resume_bit_identical(
    hosts: Callable[[int], Hosts], nodes: list[Node], tmp_path: Path
) -> None:
    net = hosts(2)
    calls = _fake_scontrol(tmp_path / "bin")
    slurm = {"SLURM_JOB_ID": "4242", "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    job = tmp_path / "job"
    flags = ["--preempt-signals", "SIGUSR1", "--requeue"]
    first = _job(net, tmp_path, nodes, "pre", job, flags, [str(HOLD_AT)], env=slurm)
    held = [job / f"ready_rank{r}" for r in range(2)]
    wait_for(lambda: all(p.exists() for p in held), 120, "both ranks at the held step")
    os.kill(first[1].proc.pid, signal.SIGUSR1)  # ONE agent, and not node rank 0's
    codes = [node.finish(120) for node in first]
    assert codes == [REQUEUE_EXIT_CODE] * 2, [n.stderr for n in first]
    saved = [json.loads((job / f"saved_rank{r}.json").read_text()) for r in range(2)]
    assert saved == [{"step": HOLD_AT}] * 2
    for node in first:
        assert "job preempted (SIGUSR1 on " in node.stderr, node.stderr
        (report,) = node.logs.glob("*/report.json")
        data = json.loads(report.read_text())
        assert data["exit_code"] == REQUEUE_EXIT_CODE
        assert data["preempted"]["signal"] == "SIGUSR1" and data["preempted"]["node"] == 1
        assert data["preempted"]["step"] == HOLD_AT
        assert data["preempted"]["stopped_at_deadline"] == []
        assert all(not alive(e["pid"]) for e in data["exits"])
    assert calls.read_text().splitlines() == ["requeue 4242"]  # node rank 0 only, once

    # The same job again resumes from the checkpoint and runs to the end; its weights are
    # those of a run that was never interrupted.
    again = _job(net, tmp_path, nodes, "again", job)
    assert [n.finish(120) for n in again] == [0, 0], [n.stderr for n in again]
    assert f"rank 0 resumed at step {HOLD_AT}" in again[0].stdout
    straight = tmp_path / "straight"
    whole = _job(net, tmp_path, nodes, "whole", straight)
    assert [n.finish(120) for n in whole] == [0, 0], [n.stderr for n in whole]
    resumed, uninterrupted = torch.load(job / "final.pt"), torch.load(straight / "final.pt")
    assert resumed.keys() == uninterrupted.keys()
    for key, value in uninterrupted.items():
        assert torch.equal(resumed[key], value), key


def test_every_worker_of_every_node_is_told_without_a_collective(
    hosts: Callable[[int], Hosts], nodes: list[Node], tmp_path: Path
) -> None:
    """No process group: node 0's worker learns of node 1's signal only through its agent
    (the job event), and gets the notice and the signal itself (its own handler); its child
    process (a data loader's stand-in) is not sent the signal."""
    net, out, port = hosts(2), tmp_path / "out", free_port()
    out.mkdir()
    for i in range(2):
        args = [
            "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{net.addr(0)}:{port}", "--rdzv-id", "told", "--rdzv-conf", FAST,
            "--preempt-signals", "SIGUSR1", worker("preempt_listen.py"), str(out),
        ]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"told{i}"))
    wait_for(lambda: all((out / f"up_rank{r}").exists() for r in range(2)), 120, "both ranks up")
    os.kill(nodes[1].proc.pid, signal.SIGUSR1)
    assert [n.finish(120) for n in nodes] == [REQUEUE_EXIT_CODE] * 2, [n.stderr for n in nodes]
    for rank in range(2):
        seen = json.loads((out / f"rank{rank}.json").read_text())
        assert seen == {"noticed": True, "signals": [signal.SIGUSR1]}, rank
    assert not (out / "child_got_signal").exists()


def _sleeping_pair(
    net: Hosts, nodes: list[Node], tmp_path: Path, name: str, *, grace: float
) -> Path:
    """Two agents (c10d, ``--preempt-signals SIGUSR1``, ``--preempt-grace grace``) whose one
    worker each sleeps with a child and never asks; returns once all four are up, with the
    directory of their pid files."""
    pids_dir, port = tmp_path / "pids", free_port()
    pids_dir.mkdir()
    for i in range(2):
        args = [
            "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{net.addr(0)}:{port}", "--rdzv-id", name,
            "--rdzv-conf", FAST, "--preempt-signals", "SIGUSR1", "--preempt-grace", f"{grace:g}",
            worker("sleep_tree.py"), str(pids_dir),
        ]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"{name}{i}"))
    wait_for(lambda: len(read_pids(pids_dir)) == 4, 120, "2 workers and their children")
    return pids_dir


def test_the_deadline_is_the_jobs_a_node_not_signalled_stops_its_workers_too(
    hosts: Callable[[int], Hosts], nodes: list[Node], tmp_path: Path
) -> None:
    """Workers that never ask, on two nodes; only node 1 is signalled: node 0 stops its own
    by the job's deadline as well (it heard it from node 1), both exit 75."""
    pids_dir = _sleeping_pair(hosts(2), nodes, tmp_path, "deadline", grace=3)
    pids = read_pids(pids_dir)
    os.kill(nodes[1].proc.pid, signal.SIGUSR1)
    assert [n.finish(120) for n in nodes] == [REQUEUE_EXIT_CODE] * 2, [n.stderr for n in nodes]
    wait_for(lambda: not any(alive(p) for p in pids), 10, "every worker and child gone")
    for rank, node in enumerate(nodes):
        preempted = _report(node.logs)["preempted"]
        assert isinstance(preempted, dict)
        assert preempted["node"] == 1 and preempted["stopped_at_deadline"] == [rank]


def test_a_node_gone_during_the_grace_is_part_of_the_preemption(
    hosts: Callable[[int], Hosts], nodes: list[Node], tmp_path: Path
) -> None:
    """Node 1 is signalled, then SIGKILLed (its scheduler did not wait): node 0 still ends
    as preempted (75), not as a failed job."""
    _sleeping_pair(hosts(2), nodes, tmp_path, "gone", grace=600)
    os.kill(nodes[1].proc.pid, signal.SIGUSR1)
    wait_for(lambda: "preempted: node 1" in nodes[0].stderr, 60, "node 0 hearing of it")
    nodes[1].kill()
    assert nodes[0].finish(120) == REQUEUE_EXIT_CODE, nodes[0].stderr


def test_a_nodes_own_signal_after_the_notice_is_not_a_second_one(
    hosts: Callable[[int], Hosts], nodes: list[Node], tmp_path: Path
) -> None:
    """A scheduler signals every node; node 0's own signal comes after node 1's notice (on
    a loaded host it may: a Slurm CI run). It joins the preemption under way, its workers
    run on; only a second signal to a node ends its grace at once. Both exit 75."""
    pids_dir = _sleeping_pair(hosts(2), nodes, tmp_path, "race", grace=600)
    pids = read_pids(pids_dir)
    os.kill(nodes[1].proc.pid, signal.SIGUSR1)
    wait_for(lambda: "preempted: node 1" in nodes[0].stderr, 60, "node 0 hearing of it")
    os.kill(nodes[0].proc.pid, signal.SIGUSR1)  # its first: the scheduler's, a moment late
    wait_for(lambda: "preempted: SIGUSR1 here too" in nodes[0].stderr, 60, "node 0's signal")
    assert "again during the grace" not in nodes[0].stderr, nodes[0].stderr
    assert all(alive(p) for p in pids), nodes[0].stderr  # the grace goes on (600 s)
    for node in nodes:  # the scheduler's second signal, to both: the grace ends now
        os.kill(node.proc.pid, signal.SIGUSR1)
    assert [n.finish(120) for n in nodes] == [REQUEUE_EXIT_CODE] * 2, [n.stderr for n in nodes]
    assert all("SIGUSR1 again during the grace" in n.stderr for n in nodes), nodes[0].stderr


def _report(log_dir: Path) -> dict[str, object]:
    (report,) = log_dir.glob("*/report.json")
    data: dict[str, object] = json.loads(report.read_text())
    return data


def test_a_script_that_does_not_listen_is_stopped_within_the_grace(tmp_path: Path) -> None:
    """Workers that sleep (with children) and never ask: stopped at the deadline, exit 75,
    the report says so, no process left."""
    flags = ["--preempt-signals", "SIGUSR1", "--preempt-grace", "2", "--max-restarts", "3"]
    launcher, pids, stderr = start_tree(tmp_path, flags)
    try:
        os.kill(launcher.pid, signal.SIGUSR1)
        assert launcher.wait(60) == REQUEUE_EXIT_CODE, stderr.read_text()
        wait_for(lambda: not any(alive(p) for p in pids), 10, "every worker and child gone")
        text = stderr.read_text()
        assert "job preempted (SIGUSR1 on this node" in text, text
        assert "ranks stopped at the deadline: 0, 1" in text, text
        report = _report(tmp_path / "logs")
        preempted, exits = report["preempted"], report["exits"]
        assert isinstance(preempted, dict) and preempted["stopped_at_deadline"] == [0, 1]
        # Stopped by phalanx at the deadline, not by the forwarded SIGUSR1's default action.
        assert isinstance(exits, list) and all(e["returncode"] != -signal.SIGUSR1 for e in exits)
        (run_dir,) = (tmp_path / "logs").iterdir()
        assert sorted(p.name for p in run_dir.glob("attempt_*")) == ["attempt_0"]  # no restart
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        kinds = [e["kind"] for e in events]
        assert "preempt" in kinds and "restart" not in kinds
        (end,) = [e for e in events if e["kind"] == "job_end"]
        assert (end["outcome"], end["exit_code"]) == ("preempted", REQUEUE_EXIT_CODE)
    finally:
        end_all(launcher, pids)


def test_a_script_that_ignores_sigterm_is_killed_at_the_deadline(tmp_path: Path) -> None:
    """SIGTERM as the preemption signal (Kubernetes), a script that ignores it: SIGKILL at
    the deadline, exit 75, nothing left."""
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    argv = [*PHALANX, "--preempt-signals", "SIGTERM", "--preempt-grace", "2", "--log-dir",
            str(tmp_path / "logs"), worker("stubborn_sleep.py"), str(pids_dir)]  # fmt: skip
    launcher = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    pids: list[int] = []
    try:
        wait_for(lambda: len(read_pids(pids_dir)) == 1, 60, "the worker's pid")
        pids = read_pids(pids_dir)
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == REQUEUE_EXIT_CODE, err.decode()
        assert not alive(pids[0])
        assert _report(tmp_path / "logs")["exit_code"] == REQUEUE_EXIT_CODE
    finally:
        end_all(launcher, pids)


@pytest.mark.parametrize(
    ("second", "code"), [(signal.SIGINT, 128 + signal.SIGINT), (signal.SIGUSR1, REQUEUE_EXIT_CODE)]
)
def test_a_second_signal_during_the_grace_stops_at_once(
    second: signal.Signals, code: int, tmp_path: Path
) -> None:
    """Ctrl-C during the grace is an interrupt (130), the preemption signal again is the
    preemption's end (75): at once, not after the grace (600 s; the wait is 60)."""
    flags = ["--preempt-signals", "SIGUSR1", "--preempt-grace", "600"]
    launcher, pids, stderr = start_tree(tmp_path, flags)
    try:
        os.kill(launcher.pid, signal.SIGUSR1)
        wait_for(lambda: "preempted: SIGUSR1" in stderr.read_text(), 30, "the preemption")
        os.kill(launcher.pid, second)
        assert launcher.wait(60) == code, stderr.read_text()
        wait_for(lambda: not any(alive(p) for p in pids), 10, "every worker and child gone")
    finally:
        end_all(launcher, pids)


def test_a_real_failure_during_the_grace_is_a_failure(tmp_path: Path) -> None:
    """A worker that exits 3 after the notice: the job fails with 3, not 75."""
    out = tmp_path / "out"
    out.mkdir()
    argv = [*PHALANX, "--preempt-signals", "SIGUSR1", "--log-dir", str(tmp_path / "logs"),
            worker("preempt_listen.py"), str(out), "fail"]  # fmt: skip
    launcher = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        wait_for(lambda: (out / "up_rank0").exists(), 60, "the worker up")
        launcher.send_signal(signal.SIGUSR1)
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 3, err.decode()
        assert "preempted" not in _report(tmp_path / "logs")
    finally:
        end_all(launcher, [])


def test_a_failing_scontrol_is_one_warning_and_the_exit_stays_75(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text("#!/bin/sh\necho 'Requeue of job 7 denied' >&2\nexit 1\n")
    scontrol.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, SLURM_JOB_ID="7", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    argv = [*PHALANX, "--preempt-signals", "SIGUSR1", "--requeue", "--log-dir",
            str(tmp_path / "logs"), worker("preempt_listen.py"), str(out)]  # fmt: skip
    launcher = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True
    )
    try:
        wait_for(lambda: (out / "up_rank0").exists(), 60, "the worker up")
        launcher.send_signal(signal.SIGUSR1)
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == REQUEUE_EXIT_CODE, err.decode()
        assert "Traceback" not in err.decode()
        (line,) = [x for x in err.decode().splitlines() if "--requeue" in x]
        assert line == "phalanx: --requeue: scontrol requeue 7 exited 1: Requeue of job 7 denied"
    finally:
        end_all(launcher, [])


def test_sigterm_as_a_preemption_signal_still_stops_workers_on_a_failure(tmp_path: Path) -> None:
    """Under --preempt-signals SIGTERM the worker code absorbs SIGTERM only during a
    preemption's grace: the SIGTERM that stops the others after a failure ends them."""
    argv = [*PHALANX, "--nproc-per-node", "2", "--preempt-signals", "SIGTERM",
            "--shutdown-timeout", "60", "--log-dir", str(tmp_path / "logs"),
            worker("fail_rank.py"), "0", "3"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    exits = _report(tmp_path / "logs")["exits"]
    assert isinstance(exits, list)
    assert {e["rank"]: e["returncode"] for e in exits} == {0: 3, 1: -signal.SIGTERM}
