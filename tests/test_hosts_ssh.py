"""Many hosts from one command, for real: an sshd per host in network namespaces (keys made
here, ``tests/support/sshd.py``), the controller in a third namespace, started with
``--hostfile`` and ``--ssh-config`` like a user would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.launch import remove_job_cgroups, wait_for, worker
from support.netns import NetNamespaces
from support.sshd import SshHosts, needs_sshd

pytestmark = needs_sshd
REPO = Path(__file__).parents[1]


@pytest.fixture
def ssh_hosts(
    netns: Callable[[int], NetNamespaces], tmp_path: Path
) -> Iterator[SshHosts]:
    """host1 and host2 with sshd; namespace 0 is the controller's."""
    hosts = SshHosts(netns(3), tmp_path, [1, 2])
    try:
        yield hosts
    finally:
        try:
            for name in hosts.names:  # a test that failed may leave its job behind
                for pid in hosts.job_pids(name):
                    os.kill(pid, signal.SIGKILL)
        finally:
            hosts.stop()
            remove_job_cgroups(tmp_path / "logs")


def controller(
    hosts: SshHosts, tmp_path: Path, script: str, *args: str, slots: int = 2
) -> subprocess.Popen[str]:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(
        "# two hosts, DeepSpeed's format\n"
        + "".join(f"{name} slots={slots}\n" for name in hosts.names)
    )
    argv = [sys.executable, "-m", "phalanx", "--hostfile", str(hostfile),
            "--ssh-config", str(hosts.config), "--env", "GLOO_SOCKET_IFNAME",
            "--log-dir", str(tmp_path / "logs"), script, *args]  # fmt: skip
    env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", PYTHONPATH=str(REPO / "src"))
    return subprocess.Popen(
        hosts.spaces.command(0, argv), cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str], timeout: float = 150) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the controller did not finish:\n{out}\n{err}") from None
    return proc.returncode, out, err


def test_two_hosts_two_workers_form_one_world_of_four(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    ssh_hosts.start()
    code, out, err = finish(controller(ssh_hosts, tmp_path, worker("allreduce.py")))
    assert code == 0, f"{out}\n{err}"
    sums = sorted(line for line in out.splitlines() if "sum=" in line)
    assert len(sums) == 4, out
    assert all("sum=10" in line for line in sums), out  # 1+2+3+4: one world of 4
    assert {line.split(":")[0] for line in sums} == {"host1", "host2"}, out
    assert {f"[rank{r}]" for r in range(4)} == {line.split()[1].rstrip(":") for line in sums}
    assert "GLOO_SOCKET_IFNAME" in err  # the forwarded names are printed once
    for name in ssh_hosts.names:
        assert ssh_hosts.job_pids(name) == []
