"""Many hosts from one command, for real: an sshd per host in network namespaces (keys made
here, ``tests/support/sshd.py``), the controller in a third namespace, started with
``--hostfile`` and ``--ssh-config`` like a user would. The job's world, its failure report,
its token, its stop and the pre-flight; preemption, ``phalanx check``, excluded hosts and
spares are in ``test_hosts_ssh_rounds.py`` (split so that two pytest workers run them)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from support.launch import wait_for, worker
from support.netns import NetNamespaces
from support.ssh_jobs import REPO, controller, finish, two_ssh_hosts
from support.sshd import SshHosts, needs_sshd

pytestmark = needs_sshd


@pytest.fixture
def ssh_hosts(netns: Callable[[int], NetNamespaces], tmp_path: Path) -> Iterator[SshHosts]:
    """host1 and host2 with sshd; namespace 0 is the controller's."""
    with two_ssh_hosts(netns, tmp_path) as hosts:
        yield hosts


def test_two_hosts_two_workers_form_one_world_of_four(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    ssh_hosts.start()
    code, out, err = finish(controller(ssh_hosts, tmp_path, worker("allreduce.py")))
    assert code == 0, f"{out}\n{err}"
    sums = sorted(line for line in out.splitlines() if "sum=" in line)
    assert len(sums) == 4, out
    assert all("sum=10" in line for line in sums), out  # 1+2+3+4: one world of 4
    assert {line.split(":")[0] for line in sums} == {"host1", "host2"}, out
    assert {f"[rank{r}]" for r in range(4)} == {line.split()[1].rstrip(":") for line in sums}
    (forwarded,) = [line for line in err.splitlines() if "environment forwarded" in line]
    assert "GLOO_SOCKET_IFNAME" in forwarded and "PYTHONPATH" in forwarded, forwarded
    for name in ssh_hosts.names:
        assert ssh_hosts.job_pids(name) == []


def test_a_failing_rank_on_host2_gives_one_job_report_with_its_name_and_code(
    ssh_hosts: SshHosts, tmp_path: Path
) -> None:
    ssh_hosts.start()
    code, out, err = finish(controller(ssh_hosts, tmp_path, worker("fail_rank.py"), "3", "7"))
    assert code == 7, f"{out}\n{err}"
    assert err.count("Root cause:") == 1, err  # every agent prints it; the controller once
    (cause,) = [line for line in err.splitlines() if "Root cause:" in line]
    assert "rank 3" in cause and "on host2" in cause, cause
    assert "host2: [rank3]: rank 3 giving up with 7" in err
    for name in ssh_hosts.names:
        wait_for(lambda n=name: ssh_hosts.job_pids(n) == [], 10, f"nothing left on {name}")


def _running_job(hosts: SshHosts, tmp_path: Path, stubborn: bool = False) -> subprocess.Popen[str]:
    """4 workers (each with a child, or each ignoring SIGTERM under a 600 s grace), all up."""
    pids = tmp_path / "pids"
    pids.mkdir()
    if stubborn:
        proc = controller(hosts, tmp_path, worker("stubborn_sleep.py"), str(pids),
                          flags=["--shutdown-timeout", "600"])  # fmt: skip
    else:
        proc = controller(hosts, tmp_path, worker("sleep_tree.py"), str(pids))
    expected = 4 if stubborn else 8
    try:
        wait_for(lambda: len(list(pids.glob("*.pid"))) == expected, 90, "the workers up")
    except AssertionError:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"the job did not start: {proc.communicate()}") from None
    for name in hosts.names:
        assert hosts.job_pids(name), f"no job processes seen on {name}"
    return proc


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(
        item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item
    )


def _command_lines() -> list[str]:
    """The command line of every process on this machine (every namespace)."""
    lines = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            lines.append("\0".join(proc.cmdline()))
    return lines


def _impostor(hosts: SshHosts, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """An agent started by hand on host1, where the job's store is, with the job's run id,
    script and arguments, but without its token."""
    pid = next(p for p in hosts.job_pids("host1") if "--rdzv-id" in psutil.Process(p).cmdline())
    argv = psutil.Process(pid).cmdline()
    run_id = argv[argv.index("--rdzv-id") + 1]
    impostor = [sys.executable, "-m", "phalanx", "--log-dir", str(tmp_path / "impostor"),
                "--nnodes", "1:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{hosts.addr('host1')}:29400", "--rdzv-id", run_id,
                "--rdzv-conf", "is_host=false,join_timeout=30", *argv[-2:]]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PHALANX_RDZV_TOKEN"}
    return subprocess.run(hosts.spaces.command(1, impostor), env=env, cwd=REPO, text=True,
                          capture_output=True, timeout=120)  # fmt: skip


def test_the_job_token_reaches_every_agent_and_no_command_line(
    ssh_hosts: SshHosts, tmp_path: Path
) -> None:
    ssh_hosts.start()
    proc = _running_job(ssh_hosts, tmp_path)
    try:
        tokens = {
            name: {_environ(pid).get("PHALANX_RDZV_TOKEN") for pid in ssh_hosts.job_pids(name)}
            - {None}
            for name in ssh_hosts.names
        }
        (token,) = tokens["host1"]
        assert tokens["host2"] == {token} and len(token) == 32, tokens
        assert not [line for line in _command_lines() if token in line]
        impostor = _impostor(ssh_hosts, tmp_path)
        assert impostor.returncode == 1, impostor.stderr
        last = impostor.stderr.strip().splitlines()[-1]
        assert "refused this node" in last and "rendezvous token" in last, impostor.stderr
        assert proc.poll() is None  # the job runs on
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(proc, timeout=30)


@pytest.mark.parametrize(
    "fault", ["ctrl-c", "sigterm", "controller-sigkill", "link-cut", "ctrl-c-stubborn"]
)
def test_a_stopped_or_lost_controller_leaves_nothing_on_any_host_within_10_s(
    ssh_hosts: SshHosts, tmp_path: Path, fault: str
) -> None:
    """ctrl-c-stubborn: workers ignore SIGTERM and the grace is 600 s; the lifeline's SIGKILL
    of the agent (its guardian then kills the workers) still ends everything in time."""
    ssh_hosts.start()
    proc = _running_job(ssh_hosts, tmp_path, stubborn=fault == "ctrl-c-stubborn")
    try:
        if fault.startswith("ctrl-c"):
            proc.send_signal(signal.SIGINT)
        elif fault == "sigterm":
            proc.send_signal(signal.SIGTERM)
        elif fault == "controller-sigkill":
            proc.send_signal(signal.SIGKILL)  # its ssh clients live on, in sessions of their own
        else:
            ssh_hosts.spaces.cut(ssh_hosts.indexes[1])  # host2's link: no reset, only silence
        for name in ssh_hosts.names:
            wait_for(lambda n=name: ssh_hosts.job_pids(n) == [], 10, f"nothing left on {name}")
        code, out, err = finish(proc, timeout=30)
        expected = {"ctrl-c": 130, "ctrl-c-stubborn": 130, "sigterm": 143,
                    "controller-sigkill": -9, "link-cut": 1}  # fmt: skip
        assert code == expected[fault], f"{out}\n{err}"
        if fault == "link-cut":
            assert "the ssh session to host2 was lost" in err, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    # The controller's ssh clients end with their sessions (none is left in its namespace).
    wait_for(lambda: _namespace_pids(ssh_hosts.spaces.names[0]) == [], 15, "the ssh clients gone")


def _namespace_pids(namespace: str) -> list[str]:
    listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return listed.stdout.split()


def test_preflight_refuses_each_host_that_differs_naming_it_and_starts_nothing(
    ssh_hosts: SshHosts, tmp_path: Path
) -> None:
    """host1 lacks the script (a tmpfs over its directory) and serves the rendezvous port
    already; host2 has another torch (its METADATA bind-mounted over) and another script;
    the controller's own address, with no sshd, is not reachable."""
    import importlib.metadata

    job = tmp_path / "job"
    job.mkdir()
    script = job / "train.py"
    script.write_text(Path(worker("allreduce.py")).read_text())
    other = tmp_path / "other.py"
    other.write_text("print('not the same script')\n")
    real = Path(str(importlib.metadata.distribution("torch").locate_file(""))) / (
        f"torch-{importlib.metadata.version('torch')}.dist-info/METADATA"
    )
    fake = tmp_path / "METADATA"
    fake.write_text("".join(
        "Version: 2.0.1\n" if line.startswith("Version:") else line
        for line in real.read_text().splitlines(keepends=True)
    ))  # fmt: skip
    ssh_hosts.start(
        {
            "host1": [("tmpfs", str(job))],
            "host2": [(str(fake), str(real)), (str(other), str(script))],
        }
    )
    listener = subprocess.Popen(ssh_hosts.spaces.command(1, [sys.executable, "-c", (
        "import socket,sys,time;s=socket.socket();s.bind((sys.argv[1],29400));s.listen();"
        "print('up',flush=True);time.sleep(120)"), ssh_hosts.addr("host1")]),
        stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert listener.stdout is not None and listener.stdout.readline() == "up\n"
        hostfile = tmp_path / "hostfile"
        hostfile.write_text(f"host1 slots=1\nhost2 slots=1\n{ssh_hosts.spaces.addr(0)} slots=1\n")
        argv = [sys.executable, "-m", "phalanx", "--hostfile", str(hostfile),
                "--ssh-config", str(ssh_hosts.config), "--log-dir", str(tmp_path / "logs"),
                str(script)]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
        done = subprocess.run(ssh_hosts.spaces.command(0, argv), cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        listener.kill()
        listener.wait(10)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("phalanx: error: ")]
    mine = importlib.metadata.version("torch")
    assert errors == [
        f"phalanx: error: host1: the script {script} is not there (in {REPO})",
        "phalanx: error: host1: the rendezvous port 29400 is already in use",
        f"phalanx: error: host2: torch 2.0.1, but the controller has {mine}",
        f"phalanx: error: host2: the script {script} differs from the controller's (sha256)",
        f"phalanx: error: {ssh_hosts.spaces.addr(0)}: ssh failed: " + errors[4].split("ssh failed: ")[-1],
        "phalanx: error: pre-flight failed: nothing was started on any host",
    ], done.stderr  # fmt: skip
    assert "Connection refused" in errors[4], errors[4]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())
