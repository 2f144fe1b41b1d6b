"""The c10d store's host lost under ``--hostfile`` with three real sshd hosts (split from
``test_store_failover.py`` so that two pytest workers run the halves): the first host's
agent (it serves the store) SIGKILLed, or the third host cut off from the two others by
iptables; the controller goes on, the others fail over or go on without it, finish
bit-identical to an uninterrupted run, and the controller exits 0 with nothing left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from support.failover import CONF, HANG, STEPS, reference_weights, then_fast, world_again
from support.launch import remove_job_cgroups, wait_for, worker
from support.netns import NetNamespaces
from support.sshd import SshHosts, needs_sshd

REPO = Path(__file__).parents[2]
pytestmark = needs_sshd


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return reference_weights(tmp_path_factory)


def _controller(hosts: SshHosts, tmp_path: Path) -> tuple[subprocess.Popen[str], Path, Path]:
    """``--hostfile`` of the three sshd hosts at ``--nnodes 2:3``, the controller in the
    first namespace, training until every host has trained a few steps: the controller, the
    shared directory, the log directory."""
    shared, logs = tmp_path / "shared", tmp_path / "logs"
    shared.mkdir()
    hosts.start()
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{name} slots=1\n" for name in hosts.names))
    argv = [sys.executable, "-m", "phalanx", "--hostfile", str(hostfile), "--nnodes", "2:3",
            "--max-restarts", "2", "--ssh-config", str(hosts.config), "--env",
            "GLOO_SOCKET_IFNAME", "--log-dir", str(logs), "--rdzv-conf", CONF,
            worker("failover_train.py"), str(shared), str(STEPS)]  # fmt: skip
    env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", PYTHONPATH=str(REPO / "src"))
    proc = subprocess.Popen(
        hosts.spaces.command(0, argv), cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip

    def training() -> bool:
        assert proc.poll() is None, proc.communicate()
        steps = shared / "steps-0"
        return steps.exists() and sum("world=3" in s for s in steps.read_text().split("\n")) >= 6

    wait_for(training, HANG, "all three hosts to train")
    return proc, shared, logs


def _ended(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """The controller's stdout and stderr once it ended (SIGKILLed and failed past HANG)."""
    try:
        return proc.communicate(timeout=HANG)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the controller did not finish:\n{out}\n{err}") from None


def test_under_a_hostfile_the_others_fail_over_when_the_first_hosts_agent_is_sigkilled(
    netns: Callable[[int], NetNamespaces], tmp_path: Path, reference: bytes
) -> None:
    """``--hostfile`` with three real sshd hosts: the agent of the first host (it serves the
    store) SIGKILLed, its ssh session ends; the controller goes on, the other two fail over,
    finish bit-identical, and the controller exits 0 with nothing left on any host."""
    hosts = SshHosts(netns(4), tmp_path, [1, 2, 3])
    logs = tmp_path / "logs"
    try:
        proc, shared, logs = _controller(hosts, tmp_path)
        agents = [json.loads(p.read_text()).get("pid") for p in logs.glob("*/status.json")]
        (host,) = [pid for pid in agents
                   if pid and "is_host=true" in " ".join(psutil.Process(pid).cmdline())]  # fmt: skip
        os.kill(host, signal.SIGKILL)  # its guardian SIGKILLs its worker
        went_on = world_again(shared, 2)  # (or the controller ended: _ended says how)
        then_fast(shared, lambda: proc.poll() is not None or went_on(), "the two to go on")
        out, err = _ended(proc)
        assert proc.returncode == 0, f"{out}\n{err}"
        assert "was lost; the job goes on without it" in err, err
        assert err.count("serves the rendezvous store now") == 2, err
        assert (shared / "final.bin").read_bytes() == reference
        for name in hosts.names:
            wait_for(lambda n=name: hosts.job_pids(n) == [], 15, f"nothing left on {name}")
    finally:
        hosts.stop()
        remove_job_cgroups(logs)


def test_under_a_hostfile_a_member_cut_off_from_the_others_leaves_and_the_job_goes_on(
    netns: Callable[[int], NetNamespaces], tmp_path: Path, reference: bytes
) -> None:
    """``--hostfile`` with three real sshd hosts; the third (it does not serve the store) cut
    off from the two others by iptables in its namespace, its ssh session to the controller
    intact. It fails over to a store of its own, no quorum comes, and it leaves (exit 79):
    the controller counts it a lost member, does not stop the others, which go on at world
    size 2 and finish bit-identical, and exits 0 with nothing left on any host."""
    hosts = SshHosts(netns(4), tmp_path, [1, 2, 3])
    logs = tmp_path / "logs"
    try:
        proc, shared, logs = _controller(hosts, tmp_path)
        others = [hosts.addr(name) for name in hosts.names[:2]]
        for rule in (["INPUT", "-s"], ["OUTPUT", "-d"]):
            for addr in others:  # the controller (namespace 0) still reaches it
                iptables = ["iptables", "-A", rule[0], rule[1], addr, "-j", "DROP"]
                subprocess.run(hosts.spaces.command(3, iptables), check=True, capture_output=True)
        out, err = _ended(proc)
        assert proc.returncode == 0, f"{out}\n{err}"
        said = "host3's agent was cut off from the other members and left the job (exit 79"
        ends = ("the job goes on without it", "after the other hosts finished the job")
        assert said in err and any(end in err for end in ends), err  # (whichever ended first)
        assert "stopping the job on every host" not in err, err
        (last,) = [x for x in err.splitlines() if "phalanx: cut off: only 1 of the last" in x]
        assert last.startswith("host3: ") and "this node is out of the job" in last, last
        assert "world=2" in (shared / "steps-1").read_text()  # the two went on without it
        assert (shared / "final.bin").read_bytes() == reference
        for name in hosts.names:
            wait_for(lambda n=name: hosts.job_pids(n) == [], 15, f"nothing left on {name}")
    finally:
        hosts.stop()
        remove_job_cgroups(logs)
