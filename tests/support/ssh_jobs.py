"""What the ``--hostfile`` tests over real sshd hosts share (``tests/cli/test_hosts_ssh.py``
and ``test_hosts_ssh_rounds.py``, one module split in two so that two pytest workers run its
halves): host1 and host2 with sshd, the controller started in namespace 0 as a user would,
and its end."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from support.launch import remove_job_cgroups
from support.netns import NetNamespaces
from support.sshd import SshHosts

REPO = Path(__file__).parents[2]


@contextlib.contextmanager
def two_ssh_hosts(netns: Callable[[int], NetNamespaces], tmp_path: Path) -> Iterator[SshHosts]:
    """host1 and host2 with sshd (not started yet); namespace 0 is the controller's. After:
    every job process left on a host SIGKILLed, the sshd daemons stopped, the cgroups gone."""
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
    hosts: SshHosts, tmp_path: Path, script: str, *args: str, flags: Sequence[str] = ()
) -> subprocess.Popen[str]:
    """``phalanx --hostfile`` (two slots on each host) in namespace 0, in a session of its own."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(
        "# two hosts, DeepSpeed's format\n" + "".join(f"{name} slots=2\n" for name in hosts.names)
    )
    argv = [sys.executable, "-m", "phalanx", "--hostfile", str(hostfile),
            "--ssh-config", str(hosts.config), "--env", "GLOO_SOCKET_IFNAME",
            "--log-dir", str(tmp_path / "logs"), *flags, script, *args]  # fmt: skip
    env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", PYTHONPATH=str(REPO / "src"))
    return subprocess.Popen(
        hosts.spaces.command(0, argv), cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str], timeout: float = 150) -> tuple[int, str, str]:
    """The controller's exit code, stdout and stderr; SIGKILLed and failed past ``timeout``."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the controller did not finish:\n{out}\n{err}") from None
    return proc.returncode, out, err
