"""A real Slurm cluster for tests: ``slurmctld`` and one ``slurmd`` per network namespace.

Debian's Slurm 22.05 and MUNGE (``slurmctld``, ``slurmd``, ``slurm-client``, ``munge``;
``scripts/setup-test-env.sh`` installs them), every file in the test's directory:

- namespace 0 is the controller "host" (``slurmctld``; ``srun``, ``sinfo``, ``scancel``
  run there too, so the nodes can connect back to ``srun``); namespace ``k`` is node ``nodek``
  (``slurmd -N nodek``), all on one private bridge (``support.netns``); each daemon also has
  a UTS namespace whose hostname is its node's name, which its jobs' tasks inherit;
- ``ctl``, ``node1``, ... resolve in every namespace through ``/etc/netns/<namespace>/hosts``,
  which ``ip netns exec`` bind-mounts over ``/etc/hosts`` (the machine's own file is untouched);
- a MUNGE key made here and a ``munged`` of our own on a socket in the directory (Slurm's
  ``AuthInfo=socket=...``): a pathname Unix socket is reached from every network namespace;
- a generated ``slurm.conf`` (``SLURM_CONF`` in every Slurm command's environment) with no
  cgroups (``proctrack/linuxproc``, ``task/none``), no accounting, no database.

The namespaces are new, so Slurm's own ports (6817, 6818) are free in them by construction.
Every daemon is stopped by its pid; whatever the cluster's jobs left in the namespaces is
killed by pid (``ip netns pids``) before the namespaces go.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

import phalanx
from support.netns import NetNamespaces, unavailable_reason

SLURM_TOOLS = ("slurmctld", "slurmd", "srun", "sbatch", "squeue", "sinfo", "scontrol", "scancel",
               "munged", "mungekey")  # fmt: skip
START_TIMEOUT = 60.0  # slurmd registering and the controller marking its node idle, under load
STOP_TIMEOUT = 10.0
NETNS_ETC = Path("/etc/netns")


def _which(tool: str) -> str | None:
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/usr/bin")


def unavailable() -> str | None:
    """Why a Slurm cluster cannot be made here (None: it can)."""
    missing = [tool for tool in SLURM_TOOLS if _which(tool) is None]
    if missing:
        return (
            f"Slurm/MUNGE missing ({', '.join(missing)}; Debian: slurmctld slurmd slurm-client"
            " munge, which scripts/setup-test-env.sh installs)"
        )
    return unavailable_reason()


_REASON = unavailable()
needs_slurm = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))


class SlurmCluster:
    """``nodes`` slurmd nodes of ``cpus`` CPUs each and their controller, under ``tmp``.

    ``start()`` returns once every node is idle (or raises with the daemons' log tails);
    ``stop()`` undoes everything ``start()`` did, also after a failed start. Commands:
    ``command(argv)`` is argv on the controller's namespace with ``env()`` for Slurm."""

    def __init__(self, tmp: Path, nodes: int = 2, cpus: int = 2) -> None:
        self.tmp, self.cpus = tmp, cpus
        self.spaces = NetNamespaces(nodes + 1)
        self.node_names = [f"node{k}" for k in range(1, nodes + 1)]
        self.conf = tmp / "slurm.conf"
        self.munge_socket = tmp / "munge" / "munge.socket"
        self.daemons: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self._etc_dirs: list[Path] = []

    # -- where things are ---------------------------------------------------------------

    def addr(self, name: str) -> str:
        """The address of ``ctl`` or ``nodeK``."""
        return self.spaces.addr(self._index(name))

    def namespace(self, name: str) -> str:
        return self.spaces.names[self._index(name)]

    def _index(self, name: str) -> int:
        return 0 if name == "ctl" else self.node_names.index(name) + 1

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This environment, with ``SLURM_CONF`` naming the cluster's config, and ``extra``."""
        return dict(os.environ, SLURM_CONF=str(self.conf), **(extra or {}))

    def command(self, argv: Sequence[str], on: str = "ctl") -> list[str]:
        """``argv`` run in the namespace of ``on`` (``ctl`` or a node name)."""
        return self.spaces.command(self._index(on), list(argv))

    def run(
        self, argv: Sequence[str], timeout: float = 60, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` on the controller's namespace, its output captured."""
        return subprocess.run(
            self.command(argv), env=self.env(env), capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip

    def popen(self, argv: Sequence[str], cwd: Path) -> subprocess.Popen[str]:
        """``argv`` started on the controller's namespace in ``cwd``, its output in pipes, the
        environment ``job_env()``'s (what ``srun`` and ``sbatch`` pass on to a job)."""
        return subprocess.Popen(
            self.command(argv), cwd=cwd, env=self.env(job_env()), text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    def job_id(self, name: str) -> str:
        """The id of the queued or running job called ``name``."""
        listed = self.run(["squeue", "-h", "--name", name, "-o", "%i"])
        if not listed.stdout.split():
            raise AssertionError(f"no job {name!r} in squeue: {listed.stderr.strip()}")
        return listed.stdout.split()[0]

    def job_fields(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, ExitCode, ...)."""
        shown = self.run(["scontrol", "show", "job", "-o", job_id]).stdout
        return dict(word.split("=", 1) for word in shown.split() if "=" in word)

    # -- bringing it up -----------------------------------------------------------------

    def start(self) -> None:
        try:
            self.spaces.create()
            self._write_hosts()
            self._start_munge()
            self._write_conf()
            self._start_daemon("slurmctld", "ctl", [str(_which("slurmctld")), "-D"])
            for name in self.node_names:
                self._start_daemon(f"slurmd.{name}", name, [str(_which("slurmd")), "-D", "-N", name])  # fmt: skip
            self._wait_idle()
        except BaseException:
            self.stop()
            raise

    def _write_hosts(self) -> None:
        names = ["ctl", *self.node_names]
        table = "127.0.0.1 localhost\n" + "".join(f"{self.addr(name)} {name}\n" for name in names)
        if not NETNS_ETC.exists():
            NETNS_ETC.mkdir()
            self._etc_dirs.append(NETNS_ETC)  # removed last, if nothing else uses it by then
        for namespace in self.spaces.names:
            directory = NETNS_ETC / namespace
            directory.mkdir(parents=True, exist_ok=True)
            self._etc_dirs.append(directory)
            (directory / "hosts").write_text(table)

    def _start_munge(self) -> None:
        directory = self.munge_socket.parent
        directory.mkdir(mode=0o755, exist_ok=True)
        key = directory / "munge.key"
        subprocess.run([str(_which("mungekey")), "--create", f"--keyfile={key}"], check=True,
                       capture_output=True, timeout=30)  # fmt: skip
        log = directory / "munged.log"
        self.logs["munged"] = log
        # --force: munged refuses a socket below a directory not searchable by all (pytest's
        # tmp is 0700); every client here is root, so that check guards nothing
        with open(directory / "munged.err", "wb") as err:
            self.daemons["munged"] = subprocess.Popen(
                [str(_which("munged")), "--foreground", "--force",
                 f"--socket={self.munge_socket}", f"--key-file={key}",
                 f"--pid-file={directory / 'munged.pid'}", f"--log-file={log}",
                 f"--seed-file={directory / 'munged.seed'}"],
                stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while not self.munge_socket.exists():
            if self.daemons["munged"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start:\n{self.log_tails()}")
            time.sleep(0.05)

    def _write_conf(self) -> None:
        tmp = self.tmp
        for directory in ("state", *(f"spool/{name}" for name in self.node_names)):
            (tmp / directory).mkdir(parents=True, exist_ok=True)
        nodes = ",".join(self.node_names)
        addrs = ",".join(self.addr(name) for name in self.node_names)
        self.conf.write_text(
            "ClusterName=phx\n"
            f"SlurmctldHost=ctl({self.addr('ctl')})\n"
            "AuthType=auth/munge\nCredType=cred/munge\n"
            # cred_expire: also how long a requeued job waits before it may start again
            f"AuthInfo=socket={self.munge_socket},cred_expire=10\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            f"StateSaveLocation={tmp / 'state'}\nSlurmdSpoolDir={tmp / 'spool'}/%n\n"
            f"SlurmctldPidFile={tmp / 'slurmctld.pid'}\nSlurmdPidFile={tmp}/slurmd.%n.pid\n"
            f"SlurmctldLogFile={tmp / 'slurmctld.log'}\nSlurmdLogFile={tmp}/slurmd.%n.log\n"
            "SlurmctldDebug=info\nSlurmdDebug=info\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "JobAcctGatherType=jobacct_gather/none\n"
            "AccountingStorageType=accounting_storage/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
            "MpiDefault=none\nReturnToService=2\n"
            # a killed step's tasks get SIGKILL this long after SIGTERM
            "KillWait=5\nInactiveLimit=0\nMinJobAge=60\n"
            f"NodeName={nodes} NodeAddr={addrs} CPUs={self.cpus} State=UNKNOWN\n"
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        )
        # slurmd 22.05 loads a cgroup plugin whatever the conf says, and its autodetection
        # fails in a namespace (ip netns exec mounts a fresh /sys, without /sys/fs/cgroup's
        # mounts). Naming the plugin skips the detection; linuxproc and task/none never use it.
        (tmp / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        for name in ("slurmctld", *(f"slurmd.{n}" for n in self.node_names)):
            self.logs[name] = tmp / f"{name}.log"

    def _start_daemon(self, name: str, on: str, argv: Sequence[str]) -> None:
        """``argv`` in the namespace of ``on``, with a UTS namespace whose hostname is ``on``:
        slurmctld runs only where the hostname is SlurmctldHost's, and a job's tasks see
        their node's name as on a real cluster (where it resolves: see ``_write_hosts``)."""
        daemon = f"hostname {on} && exec {shlex.join(argv)}"
        with open(self.tmp / f"{name}.out", "wb") as out:
            self.daemons[name] = subprocess.Popen(
                self.command(["unshare", "--uts", "sh", "-c", daemon], on), env=self.env(),
                stdout=out, stderr=out, start_new_session=True,
            )  # fmt: skip

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        states = ""
        while time.monotonic() < deadline:
            for name, daemon in self.daemons.items():
                if daemon.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {daemon.returncode}:\n{self.log_tails()}"
                    )
            listed = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=30)
            states = listed.stdout.strip() or listed.stderr.strip()
            idle = [line.split()[0] for line in states.splitlines() if line.endswith(" idle")]
            if sorted(idle) == sorted(self.node_names):
                return
            time.sleep(0.3)
        raise RuntimeError(f"nodes not idle after {START_TIMEOUT:.0f} s ({states}):\n"
                           f"{self.log_tails()}")  # fmt: skip

    # -- reading it -----------------------------------------------------------------------

    def log_tails(self, lines: int = 15) -> str:
        parts = []
        for name in self.logs:
            # a daemon's own log, else its output (what it said before it could open the log)
            for path in (self.logs[name], self.tmp / f"{name}.out", self.tmp / "munge" / f"{name}.err"):  # fmt: skip
                if path.exists() and path.stat().st_size:
                    tail = path.read_text(errors="replace").splitlines()[-lines:]
                    parts.append(f"--- {path}\n" + "\n".join(tail))
                    break
        return "\n".join(parts)

    # -- taking it down -------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every daemon by pid (SIGTERM, wait, SIGKILL), kill what jobs left in the
        namespaces, remove the namespaces and their /etc/netns files. Idempotent."""
        try:
            for daemon in reversed(self.daemons.values()):
                if daemon.poll() is None:
                    daemon.send_signal(signal.SIGTERM)
            for daemon in self.daemons.values():
                try:
                    daemon.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait(STOP_TIMEOUT)
            self.daemons.clear()
            for pid in self.namespace_pids():  # slurmstepd and tasks outlive their slurmd
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            self.spaces.destroy()
            while self._etc_dirs:
                directory = self._etc_dirs.pop()
                if directory == NETNS_ETC:
                    with contextlib.suppress(OSError):  # not empty: another test's hosts
                        directory.rmdir()
                else:
                    shutil.rmtree(directory, ignore_errors=True)

    def job_pids(self) -> list[int]:
        """Processes on the nodes other than their slurmd: a job's (slurmstepd, its tasks)."""
        daemons = {daemon.pid for daemon in self.daemons.values()}
        return [pid for pid in self.namespace_pids(nodes_only=True) if pid not in daemons]

    def namespace_pids(self, nodes_only: bool = False) -> list[int]:
        pids: list[int] = []
        for namespace in self.spaces.names[1:] if nodes_only else self.spaces.names:
            listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                                    text=True)  # fmt: skip
            pids += [int(pid) for pid in listed.stdout.split()]
        return pids


def job_env() -> dict[str, str]:
    """What a job's tasks need on top of the environment: the phalanx the test imported
    (``srun`` passes the environment on), and Gloo on each node's link to the others."""
    return {"PYTHONPATH": str(Path(phalanx.__file__).parents[1]), "GLOO_SOCKET_IFNAME": "eth0"}


def static_flags(log_dir: Path, port: int = 29500) -> str:
    """The rendezvous flags of a phalanx job step written by hand from SLURM's variables (a
    shell line for ``bash -c``); the nodes' hostnames resolve to their addresses."""
    return (
        f"--nnodes 2 --node-rank $SLURM_NODEID --rdzv-backend static"
        f" --master-addr node1 --master-port {port} --log-dir {log_dir}/node$SLURM_NODEID"
    )


@contextlib.contextmanager
def running(tmp: Path, nodes: int = 2) -> Iterator[SlurmCluster]:
    """A started cluster of ``nodes`` nodes under ``tmp``; stopped after, with nothing of it
    left behind."""
    cluster = SlurmCluster(tmp, nodes)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        assert cluster.spaces.leftovers() == [], cluster.spaces.leftovers()
        assert not any((NETNS_ETC / name).exists() for name in cluster.spaces.names)
