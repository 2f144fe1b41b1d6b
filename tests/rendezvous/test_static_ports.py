"""torchrun's classic static form on two real agents (loopback), where its ports trip a user
(issue 42): two nodes that both take ``--node-rank 0`` (given, or torchrun's default when
the flag is left out) are told what to change, in one line, exit 2; ``--worker-port``
gives the workers a known ``MASTER_PORT`` in every round, where phalanx otherwise picks a
free one (its node 0 holds ``--master-port`` for the agents' store; see from-torchrun.md);
and nodes given script arguments of their own run, the difference said once across a
restart (the rest of that check: ``test_multinode_consistency``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.resources.ports import free_port
from support.launch import PHALANX, wait_for, worker

HANG = 180.0  # seconds: only catches a hang
CONF = "join_timeout=60"


class Agents:
    """Agents in their own sessions; any still running at the end is killed with its session."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, name: str, *args: str) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if k != "PHALANX_RDZV_TOKEN"}
        proc = subprocess.Popen(
            [*PHALANX, "--log-dir", str(self.tmp / f"{name}.logs"), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            proc.communicate(timeout=HANG)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    started = Agents(tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


def _static(port: int, *rank: str) -> list[str]:
    return ["--nnodes", "2", *rank, "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--rdzv-conf", CONF]  # fmt: skip


def _listening(port: int, proc: subprocess.Popen[str]) -> bool:
    assert proc.poll() is None, proc.communicate()
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.mark.parametrize("second", [["--node-rank", "0"], []], ids=["given", "default"])
def test_a_second_node_0_is_told_to_give_each_node_its_own_rank(
    agents: Agents, tmp_path: Path, second: list[str]
) -> None:
    """The second agent of a static job that also takes node rank 0 finds the port in use:
    one line says what to change, exit 2, no traceback; the first one waits on, unharmed."""
    port = free_port()
    hold = [worker("hold_until_go.py"), str(tmp_path)]
    first = agents.start("a", *_static(port, "--node-rank", "0"), *hold)
    wait_for(lambda: _listening(port, first), HANG, "node 0's store")
    other = agents.start("b", *_static(port, *second), *hold)
    _, err = other.communicate(timeout=HANG)
    assert other.returncode == 2, err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        f"phalanx: error: node 0 cannot host the rendezvous store on --master-addr 127.0.0.1 "
        f"--master-port {port}: the port is in use"
    ), err
    assert "give each node its own --node-rank (0 to 1; it defaults to 0)" in last, err
    assert "--rdzv-backend c10d" in last, err
    assert first.poll() is None  # node 0 still waits for its second node


def test_a_node_whose_master_addr_is_another_machines_is_told_it_is_not_node_0(
    agents: Agents, tmp_path: Path
) -> None:
    """A node 1 started without --node-rank on another machine: the address to host at is
    not this machine's (192.0.2.1, TEST-NET-1, is nobody's)."""
    proc = agents.start("b", "--nnodes", "2", "--master-addr", "192.0.2.1", "--master-port",
                        str(free_port()), worker("hold_until_go.py"), str(tmp_path))  # fmt: skip
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 2, err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert "192.0.2.1 is not an address of this machine, so this node is not node 0" in last
    assert "give each node its own --node-rank (0 to 1; it defaults to 0)" in last, err


def test_worker_port_is_the_workers_master_port_in_every_round(
    agents: Agents, tmp_path: Path
) -> None:
    """Two static agents with --worker-port W: the workers' MASTER_PORT is W in the first
    round and after a restart, and the Gloo world forms there (rank 0's store listens on W)."""
    port, workers = free_port(), free_port()
    out = tmp_path / "out"
    out.mkdir()
    procs = [
        agents.start(f"n{rank}", *_static(port, "--node-rank", str(rank)), "--worker-port",
                     str(workers), "--max-restarts", "1", worker("port_rounds.py"), str(out))
        for rank in (0, 1)
    ]  # fmt: skip
    for proc in procs:
        _, err = proc.communicate(timeout=HANG)
        assert proc.returncode == 0, err
    seen = {p.name: p.read_text() for p in out.iterdir()}
    assert seen["port_1_0"] == seen["port_0_1"] == seen["port_1_1"] == str(workers), seen
    assert seen["sum_0_1"] == seen["sum_1_1"] == "3", seen


def test_worker_port_cannot_be_the_static_stores_port(tmp_path: Path) -> None:
    port = free_port()
    done = subprocess.run(
        [*PHALANX, *_static(port), "--worker-port", str(port), "--dry-run",
         worker("hold_until_go.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=HANG,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"--worker-port {port}: node 0's rendezvous store holds --master-port {port}" in (
        done.stderr
    )


def test_per_node_arguments_are_said_once_while_they_hold_across_a_restart(
    agents: Agents, tmp_path: Path
) -> None:
    """Each node its own ``--tag`` (torchrun runs that): the job runs, restarts once (rank 1
    fails its first attempt), and each node says which argument differs once, not per round."""
    port = free_port()
    out = tmp_path / "out"
    out.mkdir()
    procs = [
        agents.start(f"n{rank}", *_static(port, "--node-rank", str(rank)), "--max-restarts",
                     "1", worker("port_rounds.py"), str(out), "--tag", f"node{rank}")
        for rank in (0, 1)
    ]  # fmt: skip
    for rank, proc in enumerate(procs):
        _, err = proc.communicate(timeout=HANG)
        assert proc.returncode == 0, err
        said = [line for line in err.splitlines() if "script arguments differ" in line]
        assert said == [
            "phalanx: round 0: script arguments differ between the nodes; each runs with its "
            "own, as under torchrun: --tag: node0 (node 0), node1 (node 1)"
        ], err
        (log,) = (tmp_path / f"n{rank}.logs").rglob("events.jsonl")
        kinds = [json.loads(line)["kind"] for line in log.read_text().splitlines()]
        assert kinds.count("rdzv_done") == 2 and kinds.count("script_args_differ") == 1, kinds
    assert sorted(p.name for p in out.glob("sum_*")) == ["sum_0_1", "sum_1_1"]
