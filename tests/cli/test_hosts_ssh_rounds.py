"""Many hosts from one command, for real (``tests/support/ssh_jobs.py``, split from
``test_hosts_ssh.py`` so that two pytest workers run the halves): a preemption signal to the
controller, ``phalanx check`` over ssh, an excluded host and the hosts past ``--nnodes``
that wait as spares, one of which takes a lost member's place."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from phalanx.errors import REQUEUE_EXIT_CODE
from support.launch import remove_job_cgroups, wait_for, worker
from support.netns import NetNamespaces
from support.ssh_jobs import REPO, controller, finish, two_ssh_hosts
from support.sshd import SshHosts, needs_sshd

pytestmark = needs_sshd


@pytest.fixture
def ssh_hosts(netns: Callable[[int], NetNamespaces], tmp_path: Path) -> Iterator[SshHosts]:
    """host1 and host2 with sshd; namespace 0 is the controller's."""
    with two_ssh_hosts(netns, tmp_path) as hosts:
        yield hosts


def test_a_preemption_signal_to_the_controller_preempts_every_host(
    ssh_hosts: SshHosts, tmp_path: Path
) -> None:
    """``--preempt-signals SIGUSR1``: SIGUSR1 to the controller reaches one agent over its
    lifeline, that agent's rendezvous preempts the other host, all four ranks save the same
    step, and the controller exits 75 with nothing left on either host."""
    ssh_hosts.start()
    out = tmp_path / "out"
    out.mkdir()
    proc = controller(ssh_hosts, tmp_path, worker("preempt_train.py"), str(out), "100", "3",
                      flags=["--preempt-signals", "SIGUSR1", "--preempt-grace", "20"])  # fmt: skip
    held = [out / f"ready_rank{r}" for r in range(4)]
    try:
        wait_for(lambda: all(p.exists() for p in held), 120, "every rank at the held step")
    except AssertionError:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"the job did not start: {proc.communicate()}") from None
    proc.send_signal(signal.SIGUSR1)
    code, out_text, err = finish(proc)
    assert code == REQUEUE_EXIT_CODE, f"{out_text}\n{err}"
    assert "phalanx: preempted (SIGUSR1): passed to host1's agent" in err, err
    saved = [json.loads((out / f"saved_rank{r}.json").read_text()) for r in range(4)]
    assert saved == [{"step": 3}] * 4
    for name in ssh_hosts.names:
        wait_for(lambda n=name: ssh_hosts.job_pids(n) == [], 10, f"nothing left on {name}")


def test_phalanx_check_over_ssh_prints_every_hosts_table(
    ssh_hosts: SshHosts, tmp_path: Path
) -> None:
    """``phalanx check --hostfile``: the check starts itself on every host over ssh, as a job
    would; every host prints the same table of two nodes, nobody named, exit 0."""
    ssh_hosts.start()
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{name} slots=1\n" for name in ssh_hosts.names))
    argv = [sys.executable, "-m", "phalanx", "check", "--hostfile", str(hostfile),
            "--ssh-config", str(ssh_hosts.config), "--log-dir", str(tmp_path / "logs")]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.Popen(
        ssh_hosts.spaces.command(0, argv), cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    code, out, err = finish(proc)
    assert code == 0, f"{out}\n{err}"
    for name in ssh_hosts.names:
        said = [line for line in out.splitlines() if line.startswith(f"{name}:")]
        assert any("node check, round 0, 2 nodes" in line for line in said), out
        assert sum(line.split()[-1] == "ok" for line in said) == 2, out
        assert ssh_hosts.job_pids(name) == []


def test_an_excluded_host_is_skipped_the_next_host_runs_and_the_last_waits_as_a_spare(
    netns: Callable[[int], NetNamespaces], tmp_path: Path
) -> None:
    """Four hosts, ``--nnodes 2``, an exclusion file naming host1 (by its address, as its
    agent writes it): host1 is not started; of host2, host3 and host4 (host2 hosts the
    rendezvous store in host1's place) the first two to join run the job, the third waits
    as a spare past ``join_timeout`` and leaves with exit 0 when the job finishes without it."""
    hosts = SshHosts(netns(5), tmp_path, [1, 2, 3, 4])
    try:
        hosts.start()
        excluded = tmp_path / "excluded.jsonl"
        excluded.write_text(json.dumps({"node": "n", "addr": hosts.addr("host1"),
                                        "reason": "root cause twice"}) + "\n")  # fmt: skip
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("".join(f"{name} slots=1\n" for name in hosts.names))
        argv = [sys.executable, "-m", "phalanx", "--hostfile", str(hostfile), "--nnodes", "2",
                "--exclude-file", str(excluded), "--ssh-config", str(hosts.config),
                "--env", "GLOO_SOCKET_IFNAME", "--log-dir", str(tmp_path / "logs"),
                "--rdzv-conf", "join_timeout=4", worker("steps_slowly.py"), "50"]  # fmt: skip
        env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", PYTHONPATH=str(REPO / "src"))
        proc = subprocess.Popen(
            hosts.spaces.command(0, argv), cwd=REPO, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        code, out, err = finish(proc)
        assert code == 0, f"{out}\n{err}"
        assert (
            f"phalanx: host1 ({hosts.addr('host1')}) is not started: excluded in {excluded} "
            "(root cause twice)" in err
        ), err
        assert "the last 1 host(s) started wait as spares" in err, err
        assert not [line for line in err.splitlines() if line.startswith("host1:")], err
        others = ("host2", "host3", "host4")
        spare = [name for name in others
                 if f"{name}: phalanx: the job finished while this node waited as a spare" in err]  # fmt: skip
        assert len(spare) == 1, err
        members = sorted(set(others) - set(spare))
        assert sorted(line.split(":")[0] for line in out.splitlines() if "step 49" in line) == members, out
        for name in hosts.names:
            assert hosts.job_pids(name) == []
    finally:
        hosts.stop()
        remove_job_cgroups(tmp_path / "logs")


def test_a_spare_host_takes_the_place_of_a_member_whose_agent_is_sigkilled(
    netns: Callable[[int], NetNamespaces], tmp_path: Path
) -> None:
    """Three hosts, ``--nnodes 2``: the third waits as a spare. The agent of the member that
    does not serve the store SIGKILLed (its ssh session ends): the controller goes on, the spare is in the next round, the
    all-reduce of the two ranks sums to 3 and the controller exits 0."""
    hosts = SshHosts(netns(4), tmp_path, [1, 2, 3])
    shared = tmp_path / "shared"
    shared.mkdir()
    try:
        hosts.start()
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("".join(f"{name} slots=1\n" for name in hosts.names))
        logs = tmp_path / "logs"
        argv = [sys.executable, "-m", "phalanx", "--hostfile", str(hostfile), "--nnodes", "2",
                "--max-restarts", "1", "--ssh-config", str(hosts.config),
                "--env", "GLOO_SOCKET_IFNAME", "--log-dir", str(logs), "--rdzv-conf",
                "heartbeat_interval=0.5,heartbeat_timeout=4,last_call_timeout=1",
                worker("spare_round.py"), str(shared)]  # fmt: skip
        env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", PYTHONPATH=str(REPO / "src"))
        proc = subprocess.Popen(
            hosts.spaces.command(0, argv), cwd=REPO, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        wait_for(lambda: (shared / "up.0").exists() and (shared / "up.1").exists(), 120, "round 0")

        def members() -> list[int]:
            found = [json.loads(path.read_text()) for path in logs.glob("*/status.json")]
            return [s["pid"] for s in found if s.get("state") == "running" and s.get("pid")]

        wait_for(lambda: len(members()) == 2, 60, "both members running")
        # Not the first host's agent: it serves the rendezvous store, which no spare replaces.
        (member,) = [pid for pid in members()
                     if "is_host=true" not in " ".join(psutil.Process(pid).cmdline())]  # fmt: skip
        os.kill(member, signal.SIGKILL)  # the member's agent; its worker goes with it
        code, out, err = finish(proc, timeout=180)
        assert code == 0, f"{out}\n{err}"
        assert out.count("sum=3 world=2") == 2, out  # the survivor and the spare
        assert "was lost; the job goes on without it (its agent stops itself" in err, err
        for name in hosts.names:
            wait_for(lambda n=name: hosts.job_pids(n) == [], 15, f"nothing left on {name}")
    finally:
        hosts.stop()
        remove_job_cgroups(tmp_path / "logs")
