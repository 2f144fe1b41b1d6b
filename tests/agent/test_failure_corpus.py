"""A corpus of real failures, each classified with the right root-cause rank in report.json:
an exception, sys.exit(7), SIGSEGV, SIGKILL, out of memory (in a memory cgroup the test
makes), a hang, every rank raising; and on two hosts a lost node and a hang whose suspect is
on the other host."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from phalanx.report.oom import memory_cgroup_counter
from phalanx.resources.ports import free_port
from support.hosts import Node
from support.launch import PHALANX, alive, run_phalanx, wait_for, worker
from support.tools import hang_filesystem

FAST = "heartbeat_interval=0.5,heartbeat_timeout=4,last_call_timeout=1,join_timeout=60"


def report(logs: Path) -> dict[str, object]:
    (run_dir,) = logs.iterdir()
    return dict(json.loads((run_dir / "report.json").read_text()))


@pytest.mark.parametrize(
    ("how", "code", "kind", "reason"),
    [
        ("exception", 1, "exception", "RuntimeError: corpus: the loss is nan"),
        ("exit7", 7, "exit_code", "exit code 7"),
        ("segv", 128 + signal.SIGSEGV, "signal", "killed by SIGSEGV; Python was at"),
        ("sigkill", 128 + signal.SIGKILL, "killed", "not sent by phalanx"),
    ],
)
def test_single_node_failures(tmp_path: Path, how: str, code: int, kind: str, reason: str) -> None:
    result = run_phalanx(
        ["--nproc-per-node", "2", "--log-dir", str(tmp_path), worker("fail_how.py"), how]
    )
    assert result.returncode == code, result.stderr
    assert "Root cause: rank 1 (local rank 1) on" in result.stderr and f"[{kind}]" in result.stderr
    data = report(tmp_path)
    cause = data["root_cause"]
    assert isinstance(cause, dict)
    assert (data["kind"], cause["rank"], data["collateral"]) == (kind, 1, [0])
    assert reason in str(cause["reason"])
    if how == "segv":  # faulthandler saw where: the line of ctypes.string_at(0)
        assert str(cause["reason"]).endswith("fail_how.py:18 in <module>")


def _ended(pid: int) -> bool:
    """Gone, or a zombie: it has exited (its parent may not have reaped it yet)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _waits_on_fuse(pid: int) -> bool:
    """Whether ``pid``'s main thread sleeps in the kernel waiting for the FUSE daemon."""
    return Path(f"/proc/{pid}/wchan").read_text() == "request_wait_answer"


def test_ranks_that_raise_before_phalanx_stops_them_also_failed(tmp_path: Path) -> None:
    """Every rank raises: rank 0 first, the others while phalanx is on its way to stopping
    them -- held there by the stop notice it writes before its SIGTERM (``--preempt-signals
    SIGTERM``) into a run directory whose filesystem stops answering (``support/hangfs.py``),
    until they have all exited. Each of them ended by itself, before any signal: it is in
    ``also_failed`` with its own exception, not "stopped by phalanx (exit code 1)"."""
    shared = tmp_path / "shared"
    shared.mkdir()
    with hang_filesystem(tmp_path) as (logs, switch):
        err = tmp_path / "stderr"
        with open(err, "wb") as out:
            launcher = subprocess.Popen(
                [*PHALANX, "--log-dir", str(logs), "--nproc-per-node", "3",
                 "--preempt-signals", "SIGTERM", worker("raise_when_told.py"), str(shared)],
                stdout=subprocess.DEVNULL, stderr=out, start_new_session=True,
            )  # fmt: skip
        try:
            pids = [shared / f"pid.{rank}" for rank in range(3)]
            wait_for(lambda: all(p.exists() and p.read_text() for p in pids), 60, "3 workers")
            first, *rest = (int(p.read_text()) for p in pids)
            switch.touch()  # from now on the stop notice, and every write there, waits
            (shared / "go.first").touch()
            wait_for(lambda: _ended(first), 60, "rank 0 to raise")
            # The agent has noticed and is held on its way to the SIGTERM: only then do the
            # others raise (before, it would record their exits as it did rank 0's).
            wait_for(lambda: _waits_on_fuse(launcher.pid), 60, "the agent held by the mount")
            (shared / "go.rest").touch()
            wait_for(lambda: all(_ended(pid) for pid in rest), 60, "ranks 1 and 2 to raise")
            switch.unlink()
            assert launcher.wait(60) == 1, err.read_text()
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait(10)
        said = err.read_text()
        data = report(tmp_path / "backing")
    assert data["root_cause"]["rank"] == 0, said  # type: ignore[index]
    assert data["also_failed"] == [1, 2] and data["collateral"] == [], said
    for rank in (1, 2):
        (exit_,) = [e for e in data["exits"] if e["rank"] == rank]  # type: ignore[union-attr]
        assert exit_["kind"] == "exception", exit_
        assert exit_["reason"] == f"ValueError: rank {rank} fails on its own", exit_
        assert f"also failed afterwards (ValueError: rank {rank} fails on its own)" in said
    assert "stopped by phalanx" not in said


def test_hang(tmp_path: Path) -> None:
    result = run_phalanx(
        [
            "--nproc-per-node",
            "2",
            "--stall-timeout",
            "3",
            "--log-dir",
            str(tmp_path),
            worker("hang_allreduce.py"),
        ]
    )
    assert result.returncode == 1, result.stderr
    data = report(tmp_path)
    cause = data["root_cause"]
    assert isinstance(cause, dict) and (data["kind"], cause["rank"]) == ("hang", 1)
    hang = data["hang"]
    assert isinstance(hang, dict) and [s["rank"] for s in hang["suspects"]] == [1]


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[Path]:
    """A child of this process's memory cgroup (v1 or v2) limited to ``limit`` bytes."""
    counter = memory_cgroup_counter()
    if counter is None:
        pytest.skip("no memory cgroup to make a child of")
    group = counter.parent / f"phalanx-test-{uuid.uuid4().hex[:8]}"
    v2 = counter.name == "memory.events"
    try:
        group.mkdir()
        (group / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit))
        swap = group / ("memory.swap.max" if v2 else "memory.memsw.limit_in_bytes")
        if swap.exists():
            swap.write_text("0" if v2 else str(limit))
    except OSError as exc:
        with contextlib.suppress(OSError):
            group.rmdir()
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    try:
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), 10, "an empty cgroup")
        group.rmdir()


def test_out_of_memory(tmp_path: Path) -> None:
    with memory_cgroup(256 * 1024 * 1024) as group:
        procs = group / "cgroup.procs"
        command = [*PHALANX, "--cold-start", "--nproc-per-node", "2", "--log-dir", str(tmp_path)]
        command += [worker("fail_how.py"), "oom"]
        launcher = subprocess.run(
            ["sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "sh", *command],
            capture_output=True,
            text=True,
            timeout=120,
            start_new_session=True,
        )
    assert launcher.returncode == 128 + signal.SIGKILL, launcher.stderr
    data = report(tmp_path)
    cause = data["root_cause"]
    assert isinstance(cause, dict) and (data["kind"], cause["rank"]) == ("oom", 1)
    assert "oom_kill 0 -> 1" in str(cause["reason"])
    assert "[oom]" in launcher.stderr


def two_node_args(net: object, port: int) -> list[str]:
    endpoint = f"{net.addr(0)}:{port}"  # type: ignore[attr-defined]
    return [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--rdzv-id", "corpus", "--rdzv-conf", FAST,
    ]  # fmt: skip


def test_lost_node_on_two_hosts(hosts: object, nodes: list[Node], tmp_path: Path) -> None:
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    ready = tmp_path / "ready"
    ready.mkdir()
    for i in (0, 1):
        args = [*two_node_args(net, port), worker("stacks_wait.py"), str(ready)]
        nodes.append(Node(net, i, args, tmp_path))
    wait_for(lambda: len(list(ready.glob("ready.*"))) == 2, 90, "both ranks to start")
    nodes[1].proc.kill()  # SIGKILL to node 1's agent: its worker dies with it
    assert nodes[0].proc.wait(60) == 1, nodes[0].err.read_text()
    data = report(nodes[0].logs)
    cause = data["root_cause"]
    assert isinstance(cause, dict)
    assert (data["kind"], cause["node_rank"], cause["rank"]) == ("node_lost", 1, 1)
    assert (
        "Root cause: node 1" in nodes[0].err.read_text()
        and "[node_lost]" in nodes[0].err.read_text()
    )


def test_hang_on_two_hosts_names_the_rank_on_the_other_host(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """Rank 1 (host 1) sleeps; rank 0 (host 0) waits in all_reduce. Only host 0 watches for
    stalls (host 1's timeout is an hour), and it sees only rank 0, waiting: host 1 dumps its
    rank when it hears of the hang, and the report on both hosts, merged through the store,
    names rank 1."""
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    for i, timeout in ((0, "3"), (1, "3600")):
        args = [*two_node_args(net, port), "--stall-timeout", timeout, worker("hang_allreduce.py")]
        nodes.append(Node(net, i, args, tmp_path))
    codes = [node.proc.wait(120) for node in nodes]
    assert codes == [1, 1], nodes[0].err.read_text() + nodes[1].err.read_text()
    for node in nodes:
        data = report(node.logs)
        cause = data["root_cause"]
        assert isinstance(cause, dict), node.err.read_text()
        assert (data["kind"], cause["rank"], cause["node_rank"]) == ("hang", 1, 1), (
            node.err.read_text()
        )
        assert "Root cause: rank 1 (local rank 0)" in node.err.read_text()
    for rank, node in enumerate(nodes):  # every rank's stack is on its own host's disk
        (stacks,) = node.logs.glob(f"*/attempt_0/rank_{rank}/stacks.txt")
        assert ("in all_reduce" in stacks.read_text()) == (rank == 0)
    assert "--- hang found by node 0, requested by phalanx" in stacks.read_text()
    assert "node 0 found a hang; this node's stacks:" in nodes[1].err.read_text()
    # Node 0 sees only rank 0, waiting: it names no culprit of its own before the merged
    # verdict (issue 39, part 5).
    first = nodes[0].err.read_text()
    assert "stands out" not in first and "rank 0 on" not in first.split("Root cause")[0], first
    assert "hang found here (attempt 0): no suspect among this node's ranks" in first
    assert not any(alive(node.proc.pid) for node in nodes)
