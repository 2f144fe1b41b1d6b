"""``phalanx stacks RUN_DIR``: every rank's stack while the job runs, on one node or on every
node of a multi-node job; the job then finishes."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from phalanx.hang.dumping import odd_state
from phalanx.hang.stacks import DumpTarget, request_dumps
from phalanx.resources.ports import free_port
from support.hosts import Node
from support.launch import launched, run_phalanx, wait_for, worker
from support.tools import needs_py_spy

FAST = "heartbeat_interval=0.5,heartbeat_timeout=4,last_call_timeout=1,join_timeout=60"


@pytest.mark.parametrize("mode", ["warm", "cold"])
def test_stacks_of_a_running_job_then_it_finishes(tmp_path: Path, mode: str) -> None:
    shared, logs = tmp_path / "shared", tmp_path / "logs"
    shared.mkdir()
    flags = ["--cold-start"] if mode == "cold" else []
    args = [*flags, "--nproc-per-node", "2", "--log-dir", str(logs),
            worker("stacks_wait.py"), str(shared)]  # fmt: skip
    with launched(args) as launcher:
        wait_for(lambda: len(list(shared.glob("ready.*"))) == 2, 90, "both ranks to start")
        (run_dir,) = logs.iterdir()
        for _ in range(2):  # twice: the launcher keeps answering, the job keeps running
            result = run_phalanx(["stacks", str(run_dir)], timeout=60)
            assert result.returncode == 0, result.stderr
            assert "stacks written to" in result.stderr
            for rank in (0, 1):
                assert f"=== rank {rank} (local rank {rank}, pid" in result.stdout
            # Both main threads are in the wait loop: the summary line and the dump show it.
            # Line 9 (the sleep) or line 8 (the check), wherever the dump caught the loop.
            assert len(re.findall(r"stacks_wait.py:[89] in wait_for_go", result.stdout)) >= 2
            assert re.search(r'stacks_wait.py", line [89] in wait_for_go', result.stdout)
        assert len(list(run_dir.glob("stacks_*.txt"))) == 2
        assert launcher.poll() is None
        # The launcher went back to sleep: no busy loop on the signal's wakeup byte (a spin
        # would burn about a CPU-second per second).
        agent = psutil.Process(launcher.pid)
        before = sum(agent.cpu_times()[:2])
        time.sleep(2)
        assert sum(agent.cpu_times()[:2]) - before < 0.8
        (shared / "go").touch()
        out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 0, err
        assert sorted(out.splitlines()) == ["[rank0]: done 0", "[rank1]: done 1"]


@needs_py_spy
def test_stacks_of_a_spawn_owner_cover_the_ranks_it_spawned(tmp_path: Path) -> None:
    """A spawn owner has no phalanx worker-side code: py-spy dumps it with its children."""
    shared, logs = tmp_path / "shared", tmp_path / "logs"
    shared.mkdir()
    args = ["--spawn-owner", "--nproc-per-node", "2", "--log-dir", str(logs),
            worker("owner_wait.py"), str(shared)]  # fmt: skip
    with launched(args) as launcher:
        wait_for(lambda: len(list(shared.glob("ready.*"))) == 2, 90, "both ranks to start")
        (run_dir,) = logs.iterdir()
        result = run_phalanx(["stacks", str(run_dir)], timeout=60)
        assert result.returncode == 0, result.stderr
        # The owner and its two spawned processes, each found by py-spy; both ranks waiting.
        assert result.stdout.count("Process ") >= 3, result.stdout
        assert result.stdout.count("wait_for_go (owner_wait.py:") == 2, result.stdout
        assert launcher.poll() is None
        (shared / "go").touch()
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 0, err


def test_stacks_of_a_two_node_job_from_either_node(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """One rank on each of two hosts (c10d): ``phalanx stacks`` with either node's run
    directory prints both nodes' ranks, under a header per node, the asking node first."""
    net = hosts(2)  # type: ignore[operator]
    shared = tmp_path / "shared"
    shared.mkdir()
    endpoint = f"{net.addr(0)}:{free_port()}"
    for i in (0, 1):
        args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", endpoint, "--rdzv-id", "stacks", "--rdzv-conf", FAST,
                worker("stacks_wait.py"), str(shared)]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    wait_for(lambda: len(list(shared.glob("ready.*"))) == 2, 90, "both ranks to start")
    for asker, other in ((0, 1), (1, 0)):
        (run_dir,) = nodes[asker].logs.iterdir()
        result = run_phalanx(["stacks", str(run_dir)], timeout=60)
        assert result.returncode == 0, result.stderr + nodes[asker].stderr
        out = result.stdout
        assert "stacks of 2 of 2 node(s), requested on" in out, out
        assert "no answer" not in out
        headers = [line for line in out.splitlines() if line.startswith("##### node ")]
        assert sorted(h.split()[2] for h in headers) == ["0", "1"], out
        assert f"(node {headers[0].split()[2]}) at" in out.splitlines()[0]  # the asker first
        for rank in (0, 1):  # one rank per node: local rank 0 on each
            assert f"=== rank {rank} (local rank 0, pid" in out, out
        assert len(re.findall(r'stacks_wait.py", line [89] in wait_for_go', out)) == 2, out
        assert len(list(run_dir.glob("stacks_*.txt"))) == 1  # one file, on the asking node
        wait_for(
            lambda other=other: "sent to the node that asked" in nodes[other].stderr,
            30,
            "the other node to log its answer",
        )
    assert all(node.proc.poll() is None for node in nodes)  # the job went on
    (shared / "go").touch()
    assert [node.finish() for node in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    assert sorted(node.stdout for node in nodes) == ["[rank0]: done 0\n", "[rank1]: done 1\n"]


def test_stacks_errors_are_one_line(tmp_path: Path) -> None:
    result = run_phalanx(["stacks", str(tmp_path / "nowhere")])
    assert result.returncode == 2 and "is not a phalanx run directory" in result.stderr
    assert "Traceback" not in result.stderr
    finished = run_phalanx(["--log-dir", str(tmp_path / "logs"), worker("echo_args.py")])
    assert finished.returncode == 0, finished.stderr
    (run_dir,) = (tmp_path / "logs").iterdir()
    result = run_phalanx(["stacks", str(run_dir)])
    assert result.returncode == 1 and "is not running" in result.stderr, result.stderr
    junk_files = ('{"pid": "12"}', "[1, 2]", '{"host": "x"}', "{}", "not json", "\xff\x00", "")
    for junk in junk_files:
        (run_dir / "launcher.json").write_text(junk)
        result = run_phalanx(["stacks", str(run_dir)])
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert "launcher.json" in lines[0], junk


def test_a_script_named_stacks_still_runs(tmp_path: Path) -> None:
    (tmp_path / "stacks").write_text("print('I am a script called stacks')\n")
    result = run_phalanx(["--log-dir", "logs", "stacks"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[rank0]: I am a script called stacks\n"


@contextlib.contextmanager
def frozen_sleepers(count: int, name: str) -> Iterator[list[int]]:
    """``count`` Python processes, each past its start, frozen by the cgroup-v1 freezer (state
    D: py-spy attaches and never returns). Thawed, killed and reaped after."""
    code = "import sys, time; print('ready', flush=True); time.sleep(600)"
    sleepers = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) for _ in range(count)
    ]
    group = Path("/sys/fs/cgroup/freezer") / name
    try:
        for sleeper in sleepers:
            assert sleeper.stdout is not None and sleeper.stdout.readline() == b"ready\n"
        group.mkdir()
        for sleeper in sleepers:
            (group / "cgroup.procs").write_text(str(sleeper.pid))
        (group / "freezer.state").write_text("FROZEN")
        wait_for(lambda: (group / "freezer.state").read_text().strip() == "FROZEN", 10, "frozen")
        yield [sleeper.pid for sleeper in sleepers]
    finally:
        if group.exists():
            (group / "freezer.state").write_text("THAWED")
        for sleeper in sleepers:
            sleeper.send_signal(signal.SIGKILL)
            sleeper.wait(10)
        if group.exists():
            group.rmdir()


@needs_py_spy
def test_dumps_of_ranks_stuck_in_the_kernel_share_one_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Three ranks frozen in the kernel: every py-spy is started before any is given up, and
    all are given up together at one deadline (not one deadline per rank, one after another)."""
    with frozen_sleepers(3, f"phalanx-test-{os.getpid()}-stacks") as pids:
        targets = []
        for rank, pid in enumerate(pids):
            (tmp_path / f"rank{rank}").mkdir()
            targets.append(DumpTarget(rank, pid, tmp_path / f"rank{rank}"))
        with caplog.at_level(logging.DEBUG, logger="phalanx"):
            texts = request_dumps(targets, "test", timeout=0.5, py_spy_timeout=2.0)
        assert not any(
            "py-spy" in child.name() for child in psutil.Process().children(recursive=True)
        )
    said = [record.getMessage() for record in caplog.records if record.name == "phalanx"]
    started = [i for i, line in enumerate(said) if line.startswith("stacks: py-spy started")]
    gave_up = [i for i, line in enumerate(said) if "py-spy gave no dump" in line]
    assert len(started) == 3 and len(gave_up) == 1, said
    assert max(started) < gave_up[0], said
    assert "rank(s) 0, 1, 2" in said[gave_up[0]], said
    # No faulthandler in these processes: py-spy's file is each rank's dump, saying why.
    for target in targets:
        last = (target.rank_dir / "py-spy.txt").read_text().splitlines()[-1]
        assert last == "--- py-spy gave no dump within 2 s; killed ---"
        assert texts[target.rank].splitlines()[-1] == last


def _worker_pids(run_dir: Path) -> dict[int, int]:
    """Rank -> pid, from the run's ``workers_started`` event (written by a thread: waited for)."""
    found: list[dict[str, list[int]]] = []

    def started() -> bool:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
        found[:] = [e for e in map(json.loads, lines) if e["kind"] == "workers_started"]
        return bool(found)

    wait_for(started, 30, "the workers_started event")
    return dict(zip(found[0]["ranks"], found[0]["pids"], strict=True))


def test_stacks_say_why_a_stopped_or_frozen_rank_has_none(tmp_path: Path) -> None:
    """Rank 1 stopped (SIGSTOP) and rank 2 frozen in the kernel (the cgroup-v1 freezer: state
    D) cannot dump their stacks: each line says the process state instead of "no Python
    stack"; rank 0 is in its wait loop. Then both go on and the job ends as usual."""
    shared, logs = tmp_path / "shared", tmp_path / "logs"
    shared.mkdir()
    args = ["--nproc-per-node", "3", "--log-dir", str(logs), worker("stacks_wait.py"), str(shared)]
    freezer = Path("/sys/fs/cgroup/freezer") / f"phalanx-test-{os.getpid()}-state"
    with launched(args) as launcher:
        wait_for(lambda: len(list(shared.glob("ready.*"))) == 3, 90, "the ranks to start")
        (run_dir,) = logs.iterdir()
        pids = _worker_pids(run_dir)
        freezer.mkdir()
        try:
            os.kill(pids[1], signal.SIGSTOP)
            (freezer / "cgroup.procs").write_text(str(pids[2]))
            (freezer / "freezer.state").write_text("FROZEN")
            wait_for(lambda: psutil.Process(pids[2]).status() == psutil.STATUS_DISK_SLEEP, 10,
                     "rank 2 in state D")  # fmt: skip
            result = run_phalanx(["stacks", str(run_dir)], timeout=90)
        finally:
            os.kill(pids[1], signal.SIGCONT)
            (freezer / "freezer.state").write_text("THAWED")
            (shared / "go").touch()
        _, err = launcher.communicate(timeout=60)
        wait_for(lambda: not (freezer / "tasks").read_text().strip(), 10, "the freezer empty")
        freezer.rmdir()
    assert launcher.returncode == 0, err
    assert result.returncode == 0, result.stderr
    lines = {
        int(m[1]): m[0] for m in re.finditer(r"^rank (\d+) \(node 0, pid .*$", result.stdout, re.M)
    }
    assert "stopped (state T)" in lines[1], result.stdout
    assert "in the kernel (state D, disk sleep)" in lines[2], result.stdout
    assert "wait_for_go" in lines[0], result.stdout
    assert "no Python stack" not in result.stdout, result.stdout


def test_a_zombie_is_said_to_be_one() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 10, "a zombie")
        assert odd_state(pid) == "a zombie (state Z: exited, not yet reaped)"
    finally:
        os.waitpid(pid, 0)
    assert odd_state(pid) == ""  # gone: nothing to say


@pytest.mark.timeout(60)
def test_a_rank_that_dies_instead_of_dumping_is_not_waited_for(tmp_path: Path) -> None:
    """A rank that catches the stack signal but exits before it dumps (a peer's rank whose
    collective failed as the dump was asked for: the hung rank on the other node had been
    stopped) is not waited for until the dump timeout (given here as 600 s, longer than the
    test's own timeout: the call would hang): its agent's judging waited 5 s on it."""
    code = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGUSR2, lambda *_: os._exit(1))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as dying:
        assert dying.stdout is not None and dying.stdout.readline() == "ready\n"
        target = DumpTarget(0, dying.pid, tmp_path)
        texts = request_dumps([target], "test", timeout=600.0, py_spy_timeout=600.0)
        assert dying.poll() == 1  # it died as asked, and was a zombie until now
    assert "test, requested by phalanx" in target.stacks_file.read_text()  # it was asked
    assert texts[0] == ""  # and answered nothing
