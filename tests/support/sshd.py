"""Real OpenSSH hosts for multi-host tests: an ``sshd`` per network namespace, with keys the
test generates, each started by the test as its own process and stopped by its pid.

Each sshd runs in a mount and UTS namespace of its own (``unshare``), so a "host" can have
its own hostname (the name reports carry) and files that differ from the controller's
(a bind mount over a file, a tmpfs over a directory): the namespaces otherwise share this
machine's filesystem, so the same directory and Python exist on every host. A client ssh
config (for ``--ssh-config``) names the hosts ``host1``, ``host2``, ...
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from support.launch import remove_job_cgroups
from support.netns import NetNamespaces

SSHD = "/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else shutil.which("sshd")
needs_sshd = pytest.mark.skipif(
    SSHD is None or shutil.which("ssh") is None,
    reason="sshd/ssh missing (Debian: openssh-server; scripts/setup-test-env.sh installs it)",
)

# A mount inside one host: (source, target); source "tmpfs" mounts an empty tmpfs on target.
Mount = tuple[str, str]


class SshHosts:
    """sshd on namespaces ``host_indexes`` of ``spaces``, reached from any namespace of it."""

    def __init__(
        self, spaces: NetNamespaces, tmp: Path, host_indexes: Sequence[int], port: int = 22
    ) -> None:
        self.spaces, self.tmp, self.port = spaces, tmp, port
        self.indexes = list(host_indexes)
        self.names = [f"host{n}" for n in range(1, len(self.indexes) + 1)]
        self.key = tmp / "id_ed25519"
        self.host_key = tmp / "host_ed25519"
        self.config = tmp / "ssh_config"
        self.daemons: dict[str, subprocess.Popen[bytes]] = {}
        for key in (self.key, self.host_key):
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                               check=True, capture_output=True)  # fmt: skip
        (tmp / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        blocks = [
            f"Host {name}\n  HostName {spaces.addr(i)}\n"
            for name, i in zip(self.names, self.indexes, strict=True)
        ]
        self.config.write_text(
            "".join(blocks) + f"Host *\n  User root\n  Port {port}\n  IdentityFile {self.key}\n"
            "  IdentitiesOnly yes\n  UserKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking no\n  LogLevel ERROR\n"
        )

    def addr(self, name: str) -> str:
        return self.spaces.addr(self.indexes[self.names.index(name)])

    def namespace(self, name: str) -> str:
        return self.spaces.names[self.indexes[self.names.index(name)]]

    def start(self, mounts: dict[str, Sequence[Mount]] | None = None) -> None:
        """Every host's sshd, then wait until each answers ssh from the first namespace."""
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        for name in self.names:
            self.daemons[name] = self._start(name, (mounts or {}).get(name, ()))
        deadline = time.monotonic() + 20
        for name in self.names:
            while True:
                done = subprocess.run(
                    self.spaces.command(0, ["ssh", "-F", str(self.config), "-o",
                                            "BatchMode=yes", name, "true"]),
                    capture_output=True, text=True, timeout=20,
                )  # fmt: skip
                if done.returncode == 0:
                    break
                if time.monotonic() > deadline or self.daemons[name].poll() is not None:
                    raise RuntimeError(f"sshd on {name} does not answer: {done.stderr.strip()}")
                time.sleep(0.2)

    def _start(self, name: str, mounts: Sequence[Mount]) -> subprocess.Popen[bytes]:
        config = self.tmp / f"sshd_config.{name}.{self.port}"
        # ClientAlive: this sshd's own session process goes within about 4 s of a cut link too.
        config.write_text(
            f"ListenAddress {self.addr(name)}\nPort {self.port}\nHostKey {self.host_key}\n"
            f"AuthorizedKeysFile {self.tmp / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n"
            "ClientAliveInterval 1\nClientAliveCountMax 3\nLogLevel ERROR\n"
        )
        steps = [f"hostname {name}"]
        for source, target in mounts:
            if source == "tmpfs":
                steps.append(f"mount -t tmpfs none {shlex.quote(target)}")
            else:
                steps.append(f"mount --bind {shlex.quote(source)} {shlex.quote(target)}")
        steps.append(f"exec {SSHD} -D -e -f {shlex.quote(str(config))}")
        log = open(self.tmp / f"sshd.{name}.{self.port}.log", "wb")  # noqa: SIM115
        with log:
            return subprocess.Popen(
                self.spaces.command(
                    self.indexes[self.names.index(name)],
                    ["unshare", "--mount", "--uts", "sh", "-c", " && ".join(steps)],
                ),
                stdout=log,
                stderr=log,
            )

    def job_pids(self, name: str) -> list[int]:
        """Every process in the host's network namespace except its sshd listener."""
        listed = subprocess.run(
            ["ip", "netns", "pids", self.namespace(name)], capture_output=True, text=True
        ).stdout.split()
        listener = self.daemons[name].pid
        return [int(pid) for pid in listed if int(pid) != listener]

    def stop(self) -> None:
        for daemon in self.daemons.values():
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
        for daemon in self.daemons.values():
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(10)
        self.daemons.clear()


def end_controller_job(hosts: SshHosts, proc: subprocess.Popen[str] | None, logs: Path) -> None:
    """A test's cleanup after a controller run on ``hosts``: the controller's process group
    SIGKILLed if it still runs, every job process left on a host SIGKILLed (by the PIDs
    ``job_pids`` lists), the sshd daemons stopped and the job's cgroups under ``logs`` removed."""
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    try:
        for name in hosts.names:
            for pid in hosts.job_pids(name):
                os.kill(pid, signal.SIGKILL)
    finally:
        hosts.stop()
        remove_job_cgroups(logs)
