"""Faults from outside the job, injected for real (docs/explanation/faults.md).

Each test makes the fault itself -- a full filesystem, a signal in the middle of the
rendezvous, an endpoint that does not resolve or does not answer -- and checks what the
docs (docs/explanation/faults.md) promise phalanx does about it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import psutil
import pytest

from phalanx.resources.ports import free_port
from phalanx.supervisor.cgroup import hierarchies
from support.freezer import frozen
from support.launch import PHALANX, alive, run_phalanx, wait_for, worker
from support.tools import hang_filesystem, tiny_tmpfs

HANG = 60.0  # bounds that only catch a hang



def test_a_full_log_disk_does_not_stop_a_healthy_job(tmp_path: Path) -> None:
    """200 KiB of output into a 64 KiB --log-dir: the log file fills, phalanx says so once,
    and the job goes on to its end with every line on the console."""
    with tiny_tmpfs(tmp_path / "logs") as logs:
        result = run_phalanx(["--log-dir", str(logs), worker("chatty.py"), "200"], timeout=HANG)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 200 and lines[-1].startswith("[rank0]: line 000199 ")
    said = [line for line in result.stderr.splitlines() if "No space left on device" in line]
    # Once per stream whose file found the disk full: stdout's always; stderr's line too
    # unless its writer thread got it in before stdout's filled the disk (their own threads).
    # The run's own small files (status, events, the report a success writes too) may find
    # it full: one line each.
    files = sorted(line.split("/")[-1].split()[0] for line in said)
    logs_said = [f for f in files if f.endswith(".log")]
    assert logs_said in (["stdout.log"], ["stderr.log", "stdout.log"]), result.stderr
    assert set(files) - set(logs_said) <= {"status.json", "events.jsonl", "report.json"}, (
        result.stderr
    )
    assert len(files) == len(set(files)), result.stderr  # once each
    assert "Traceback" not in result.stderr


def test_a_full_log_disk_still_gets_the_report_from_memory(tmp_path: Path) -> None:
    """A worker fails after the disk filled: the report still quotes its traceback (kept in
    memory), report.json that cannot be written is said in one line, and the exit code is
    the worker's."""
    with tiny_tmpfs(tmp_path / "logs") as logs:
        result = run_phalanx(
            ["--log-dir", str(logs), worker("chatty.py"), "200", "fail"], timeout=HANG
        )
    assert result.returncode == 1, result.stderr
    report = result.stderr[result.stderr.index("=" * 78) :]
    assert "RuntimeError: chatty failed after filling the disk" in report
    assert "report.json (No space left on device)" in result.stderr
    assert "Traceback (most recent call last)" in report  # the worker's, quoted
    assert result.stderr.count("phalanx: Traceback") == 0


def test_output_without_newlines_is_copied_in_pieces(tmp_path: Path) -> None:
    """10 MiB without a newline: the log file gets every byte, the console gets it in
    bounded pieces, each prefixed with the rank."""
    script = tmp_path / "noline.py"
    script.write_text("import sys\nsys.stdout.write('y' * (10 << 20))\nsys.stdout.flush()\n")
    result = run_phalanx(["--log-dir", str(tmp_path / "logs"), str(script)], timeout=HANG)
    assert result.returncode == 0, result.stderr
    pieces = result.stdout.splitlines()
    assert all(p.startswith("[rank0]: ") for p in pieces) and len(pieces) == 160
    assert sum(len(p) - len("[rank0]: ") for p in pieces) == 10 << 20
    (run_dir,) = (tmp_path / "logs").iterdir()
    assert (run_dir / "attempt_0" / "rank_0" / "stdout.log").stat().st_size == 10 << 20


def test_an_unwritable_log_dir_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("not a directory")
    done = subprocess.run(
        [*PHALANX, "--log-dir", str(blocker / "logs"), worker("chatty.py"), "1"],
        capture_output=True, text=True, timeout=HANG,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot make the run directory there" in lines[0], done.stderr


def _c10d(endpoint: str, nnodes: str, conf: str = "join_timeout=300") -> list[str]:
    return ["--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", "chaos", "--rdzv-conf", conf]  # fmt: skip


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """phalanx in its own session, its stderr to ``log``, its run directory beside it."""
    logs = ["--log-dir", str(log.with_suffix(".logs"))]
    with open(log, "wb") as err:
        return subprocess.Popen(
            [*PHALANX, *logs, *args], stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )


def _descendants(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def _reachable(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("side", ["store host", "client"])
def test_a_signal_while_waiting_for_the_other_nodes_ends_phalanx_at_once(
    tmp_path: Path, sig: signal.Signals, side: str
) -> None:
    """One node of two, the other never comes: Ctrl-C or SIGTERM ends it with 130 / 143, not
    after join_timeout (300 s here), and its template and guardian go with it. The client
    waits for a store nobody serves; the store host waits for a peer."""
    port = free_port()
    conf = "join_timeout=300" + (",is_host=false" if side == "client" else "")
    log = tmp_path / "agent.err"
    agent = _start([*_c10d(f"127.0.0.1:{port}", "2", conf), worker("chatty.py"), "1"], log)
    try:
        if side == "store host":
            wait_for(lambda: _reachable(port), HANG, "the agent to serve the store")
        else:
            wait_for(lambda: "trying for another" in log.read_text(), HANG, "a retry line")
        helpers = _descendants(agent.pid)
        agent.send_signal(sig)
        assert agent.wait(HANG) == 128 + sig, log.read_text()[-4000:]
        wait_for(lambda: not any(alive(pid) for pid in helpers), 10, "its helpers to be gone")
        assert "Traceback" not in log.read_text()
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(10)


def test_the_other_nodes_hear_that_a_node_left_while_joining(tmp_path: Path) -> None:
    """Two nodes of three wait for the third; SIGINT to one: it exits 130 and the other stops
    at once the same way (130, not a rendezvous error: the stop record carries the signal),
    saying a node that was joining was stopped by it."""
    port = free_port()
    args = [*_c10d(f"127.0.0.1:{port}", "3"), worker("chatty.py"), "1"]
    host = _start(args, tmp_path / "host.err")
    client = None
    try:
        wait_for(lambda: _reachable(port), HANG, "the first agent to serve the store")
        client = _start([*args[:-2], "--rdzv-conf", "join_timeout=300,is_host=false",
                         *args[-2:]], tmp_path / "client.err")  # fmt: skip
        # The client has joined round 0 once it waits there with the host: "2 of 3 present".
        said = tmp_path / "client.err"
        joined = lambda: "waiting for nodes: 2 of 3 present" in said.read_text()  # noqa: E731
        wait_for(joined, HANG, "the client to join round 0")
        client.send_signal(signal.SIGINT)
        assert client.wait(HANG) == 130
        assert host.wait(HANG) == 130
        said = (tmp_path / "host.err").read_text()
        assert "phalanx: stopped by SIGINT on a node that was joining" in said, said
    finally:
        for proc in (host, client):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def test_an_endpoint_that_does_not_resolve_fails_at_once_in_one_line(tmp_path: Path) -> None:
    """In a network namespace of its own (no DNS server can be reached, no packet leaves):
    the name fails to resolve, and phalanx says so in one line instead of retrying for
    join_timeout."""
    done = subprocess.run(
        ["unshare", "--net", *PHALANX, "--log-dir", str(tmp_path / "logs"),
         *_c10d("no-such-host.invalid:29400", "2"),
         worker("chatty.py"), "1"],
        capture_output=True, text=True, timeout=HANG,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("phalanx: --rdzv-backend c10d: cannot resolve 'no-such-host.invalid'")
    assert "Traceback" not in done.stderr and "[W" not in done.stderr


def test_an_endpoint_that_refuses_is_reported_while_phalanx_keeps_trying(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    done = subprocess.run(
        [*PHALANX, "--log-dir", str(tmp_path / "logs"),
         *_c10d(f"127.0.0.1:{port}", "2", "join_timeout=11,is_host=false"),
         worker("chatty.py"), "1"],
        capture_output=True, text=True, timeout=HANG,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    retries = [line for line in lines if "trying for another" in line]
    assert retries and all(f"127.0.0.1:{port}: Connection refused" in line for line in retries)
    assert f"127.0.0.1:{port} did not answer within 11 s: Connection refused; " in lines[-1]
    assert lines[-1].endswith(  # (one endpoint: what to change if the job's store moved)
        "give every node's address in --rdzv-endpoint (host:port,host:port,..., the job's "
        "first store first)"
    )
    assert "Traceback" not in done.stderr


def test_a_port_holder_that_never_speaks_is_reported_while_the_node_waits(tmp_path: Path) -> None:
    """A process that is not phalanx holds the endpoint's port: it listens (the kernel
    accepts every connection into its backlog) and never says a word. The node says so every
    5 s -- the address, that the store has not spoken, what it waits for and for how long --
    then one line at read_timeout, exit 1 (it was a minute of silence, then that line)."""
    with socket.create_server(("127.0.0.1", 0)) as holder:  # never accept()s, never speaks
        port = holder.getsockname()[1]
        done = subprocess.run(
            [*PHALANX, "--log-dir", str(tmp_path / "logs"),
             *_c10d(f"127.0.0.1:{port}", "2", "is_host=false,read_timeout=12"),
             worker("chatty.py"), "1"],
            capture_output=True, text=True, timeout=HANG,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    waits = [line for line in lines if "has said nothing for" in line]
    assert len(waits) >= 2, done.stderr  # said, and said again
    assert waits[0].startswith(
        f"phalanx: rendezvous: the rendezvous store at 127.0.0.1:{port} accepted the connection "
        "but has said nothing for 5 s"
    ), done.stderr
    assert all("waiting for its greeting for another" in line for line in waits)
    assert lines[-1].endswith(
        f"127.0.0.1:{port} did not answer the handshake within 12 s (a phalanx store speaks "
        "first: the process on that port is not one, or hangs)"
    ), done.stderr
    assert "Traceback" not in done.stderr


def test_junk_in_the_store_is_a_rendezvous_error_naming_the_key(tmp_path: Path) -> None:
    """A hostile (or broken) client of the c10d store writes an event that is not JSON into
    a running job: every node's heartbeat thread reads it, and each node stops its workers
    and exits 1 with one line naming the key -- no dead thread, no traceback, no false
    "store has not answered" later. The store is served here, by the test, so that no node's
    leaving takes it away from the other before it has read the junk."""
    from phalanx.rendezvous.dynamic.keys import Keys
    from phalanx.rendezvous.stores.agentstore import NO_TOKEN, AgentKVStore

    server = AgentKVStore.host("127.0.0.1", 0, token=NO_TOKEN, read_timeout=30)
    script = tmp_path / "sleeper.py"
    script.write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(300)\n")
    conf = "join_timeout=300,is_host=false"
    args = [*_c10d(f"127.0.0.1:{server.port}", "2", conf), str(script)]
    agents = [_start(args, tmp_path / f"n{i}.err") for i in (0, 1)]
    try:
        for i in (0, 1):
            log = tmp_path / f"n{i}.err"
            wait_for(lambda log=log: "round 0:" in log.read_text(), HANG, "round 0")
        workers = [p for agent in agents for p in _descendants(agent.pid)]
        keys = Keys("chaos")
        server.add(keys.round(0, "events"), 1)
        server.set(keys.event(0, 1), b"{this is not json")
        for i, agent in enumerate(agents):
            assert agent.wait(HANG) == 1
            said = (tmp_path / f"n{i}.err").read_text()
            assert f"malformed value at {keys.event(0, 1)!r}" in said, said
            assert "Traceback" not in said and "has not answered" not in said
            # The junk lands while the nodes check each other: the check stops at once
            # rather than wait out its timeouts for records the other node will never post.
            assert "did not answer the node check" not in said, said
        wait_for(lambda: not any(alive(pid) for pid in workers), 10, "every worker to be gone")
    finally:
        for proc in agents:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        server.close()


def _job_cgroup(run_dir: Path) -> list[Path]:
    """The cgroup phalanx made for the run in ``run_dir``, if it still exists."""
    return [p for root in hierarchies() if (p := root / f"phalanx-{run_dir.name}").exists()]


@pytest.mark.parametrize("mode", ["warm", "cold"])
@pytest.mark.parametrize("how", ["kill -9 of the launcher", "a worker fails"])
def test_a_process_that_left_its_session_does_not_outlive_the_job(
    tmp_path: Path, mode: str, how: str
) -> None:
    """A worker's child calls setsid(): it is in no process group phalanx knows. The job's
    cgroup still holds it, so it is gone once the launcher is -- SIGKILLed (the guardian
    empties the cgroup) or ending on a failure (the agent does) -- and the cgroup with it."""
    pids = tmp_path / "pids"
    pids.mkdir()
    args = ["--log-dir", str(tmp_path / "logs"), *(["--cold-start"] if mode == "cold" else []),
            worker("escape_session.py"), str(pids)]  # fmt: skip
    if how == "a worker fails":
        args.append("fail")
    launcher = subprocess.Popen(
        [*PHALANX, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    escaped = -1
    try:
        wait_for(lambda: (pids / "escaped.pid").exists(), HANG, "the escaped child")
        escaped = int((pids / "escaped.pid").read_text())
        assert os.getsid(escaped) == escaped  # it really left phalanx's sessions and groups
        (run_dir,) = (tmp_path / "logs").iterdir()
        assert _job_cgroup(run_dir), "the job runs in a cgroup of its own"
        if how == "kill -9 of the launcher":
            launcher.kill()
            launcher.wait(HANG)
        else:
            assert launcher.wait(HANG) == 3
        wait_for(lambda: not alive(escaped), 10, "the process that left its session to be gone")
        wait_for(lambda: not _job_cgroup(run_dir), 10, "the job cgroup to be removed")
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(10)
        if escaped > 0 and alive(escaped):
            os.kill(escaped, signal.SIGKILL)


@pytest.mark.parametrize("mode", ["warm", "cold"])
def test_a_worker_stuck_in_the_kernel_is_named_and_does_not_hold_up_the_launcher(
    tmp_path: Path, mode: str
) -> None:
    """Rank 1 is frozen (state D: SIGKILL cannot end it); rank 0 fails. phalanx SIGTERMs,
    SIGKILLs, waits a bounded time, then reports rank 1 as stuck, with its state, and exits
    with the root cause's code instead of waiting for it forever."""
    folder = tmp_path / "job"
    folder.mkdir()
    args = ["--log-dir", str(tmp_path / "logs"), "--nproc-per-node", "2",
            "--shutdown-timeout", "1", *(["--cold-start"] if mode == "cold" else []),
            worker("freeze_me.py"), str(folder)]  # fmt: skip
    launcher = subprocess.Popen(
        [*PHALANX, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: (folder / "victim.pid").exists(), HANG, "rank 1 to start")
        victim = int((folder / "victim.pid").read_text())
        with frozen(victim, f"phalanx-test-{os.getpid()}-{mode}"):
            (folder / "go").touch()
            _, stderr = launcher.communicate(timeout=HANG)
            assert launcher.returncode == 3, stderr
            assert "Root cause: rank 0 (local rank 0)" in stderr
            assert (
                "rank 1 (local rank 1) on" in stderr
                and "could not be ended: still in state D (disk sleep) after SIGKILL" in stderr
            ), stderr
            assert "Traceback" not in stderr
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate(timeout=10)
    (run_dir,) = (tmp_path / "logs").iterdir()
    for leftover in _job_cgroup(run_dir):  # not removable while the frozen worker was in it
        leftover.rmdir()


@pytest.mark.parametrize("status", [0, 3])
def test_a_log_filesystem_that_stops_answering_does_not_stop_the_job(
    tmp_path: Path, status: int
) -> None:
    """--log-dir on a mount that stops answering mid-run (its writes hang, as on a hung NFS
    server): the loop that watches the workers only queues log writes, so while the mount is
    still frozen every line reaches the console, the job's end is seen and reported, the
    stuck file and (on a failure) the report.json that cannot be written are one line each.
    A process cannot finish exiting while one of its writes waits in the kernel, so phalanx's
    own exit -- with the job's status -- comes once the mount answers again."""
    out_path, err_path = tmp_path / "console.out", tmp_path / "console.err"
    with hang_filesystem(tmp_path) as (logs, switch):
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            launcher = subprocess.Popen(
                [*PHALANX, "--log-dir", str(logs), worker("slow_chatty.py"), "150", str(status)],
                stdout=out, stderr=err, start_new_session=True,
            )  # fmt: skip
        try:
            backing = tmp_path / "backing"
            wait_for(
                lambda: any(p.stat().st_size for p in backing.glob("*/attempt_0/rank_0/stdout.log")),
                HANG, "the first lines in the log file",
            )  # fmt: skip
            switch.touch()  # from now on every write to the mount hangs
            end = "all 1 workers finished" if status == 0 else "Root cause: rank 0 (local rank 0)"
            wait_for(lambda: end in err_path.read_text(), HANG, "the job's end, still frozen")
            wait_for(
                lambda: "stdout.log: writes did not finish" in err_path.read_text(), HANG,
                "the stuck log file to be said",
            )  # fmt: skip
            if status:
                wait_for(
                    lambda: "report.json (its filesystem did not answer within 15 s of the job's end)"
                    in err_path.read_text(), HANG, "the report.json line",
                )  # fmt: skip
            assert len(out_path.read_text().splitlines()) == 150
        finally:
            switch.unlink(missing_ok=True)
            try:
                launcher.wait(HANG)
            finally:
                if launcher.poll() is None:
                    os.killpg(launcher.pid, signal.SIGKILL)
                    launcher.wait(10)
    said = err_path.read_text()
    assert launcher.returncode == status, said
    assert out_path.read_text().splitlines() == [f"[rank0]: line {i:04d}" for i in range(150)]
    assert "Traceback" not in said
