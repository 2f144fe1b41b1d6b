"""Multi-node jobs through the real CLI on ``--rdzv-backend etcd``: two phalanx agents on
loopback, real etcd servers (``tests/etcd_server.py``: one member, or a 3-member cluster)
on loopback ports, real Gloo between the workers. Every etcd member is stopped by its PID,
every agent by its process group; timeouts only catch hangs."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from phalanx.rendezvous.dynamic.pulse import DIED_REASON
from support.etcd_server import EtcdCluster, leader_index
from support.hosts import Loopback, Node
from support.launch import alive, read_pids, wait_for, worker
from support.multinode import ETCD_CONF as CONF
from support.tools import needs_etcd

pytestmark = [
    pytest.mark.slow,
    needs_etcd,
]

HANG = 120.0
LOOPBACK = Loopback()


@pytest.fixture
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=1) as cluster:
        yield cluster


def etcd_args(
    endpoint: str, nnodes: str, run_id: str, backend: str = "etcd", max_restarts: int = 0
) -> list[str]:
    return [
        "--nnodes", nnodes,
        "--nproc-per-node", "1",
        "--rdzv-backend", backend,
        "--rdzv-endpoint", endpoint,
        "--rdzv-id", run_id,
        "--rdzv-conf", CONF,
        "--max-restarts", str(max_restarts),
    ]  # fmt: skip


def host_port(url: str) -> str:
    """``http://127.0.0.1:2379`` -> ``127.0.0.1:2379`` (how the CLI takes an endpoint)."""
    return url.removeprefix("http://")


def start(nodes: list[Node], tmp: Path, args: list[str], *per_node: list[str]) -> None:
    for i, tail in enumerate(per_node):
        nodes.append(Node(LOOPBACK, i, [*args, *tail], tmp, f"n{i}"))


def wait_while_running(nodes: list[Node], predicate: Callable[[], bool], what: str) -> None:
    """``wait_for``, failing at once (with the agents' stderr) if an agent exits first."""

    def check() -> bool:
        if any(n.proc.poll() is not None for n in nodes):
            raise AssertionError(f"an agent exited before {what}:\n{stderr_of(nodes)}")
        return predicate()

    wait_for(check, HANG, what)


def stderr_of(nodes: list[Node]) -> str:
    return "".join(f"--- node {i} ---\n{n.stderr}" for i, n in enumerate(nodes))


def test_two_agent_job_completes(etcd: EtcdCluster, nodes: list[Node], tmp_path: Path) -> None:
    args = etcd_args(host_port(etcd.endpoints[0]), "2", "two")
    start(nodes, tmp_path, args, [worker("flaky_dist.py")], [worker("flaky_dist.py")])
    assert [n.finish(HANG) for n in nodes] == [0, 0], stderr_of(nodes)
    assert sorted(n.stdout.strip() for n in nodes) == [
        "[rank0]: world=2 sum=3 restart=0 rank=0 node=0",
        "[rank1]: world=2 sum=3 restart=0 rank=1 node=1",
    ]


def test_worker_failure_restarts_both_agents_under_the_etcd_v2_name(
    etcd: EtcdCluster, nodes: list[Node], tmp_path: Path
) -> None:
    args = etcd_args(
        host_port(etcd.endpoints[0]), "2", "restart", backend="etcd-v2", max_restarts=1
    )
    tail = [worker("flaky_dist.py"), "1"]  # global rank 1 exits 5 on the first attempt
    start(nodes, tmp_path, args, tail, tail)
    assert [n.finish(HANG) for n in nodes] == [0, 0], stderr_of(nodes)
    outputs = sorted(n.stdout.strip() for n in nodes)
    assert outputs == [
        "[rank0]: world=2 sum=3 restart=1 rank=0 node=0",
        "[rank1]: world=2 sum=3 restart=1 rank=1 node=1",
    ]
    assert "workers failed on node 1" in stderr_of(nodes)


@pytest.mark.parametrize(
    "endpoints",
    [
        "follower",
        "leader-first",
    ],
)
def test_stopping_the_leader_of_three_etcd_members_does_not_disturb_the_job(
    nodes: list[Node], tmp_path: Path, endpoints: str
) -> None:
    """``follower``: the agents talk to one member that stays up; stopping the leader makes
    it refuse requests ("no leader") until the other two elect a new one. ``leader-first``:
    the agents are given all three members, the leader first, so they talk to it and must
    fail over to another member as well."""
    with EtcdCluster(size=3) as cluster:
        leader = leader_index(cluster)
        others = [i for i in range(3) if i != leader]
        if endpoints == "follower":
            endpoint = host_port(cluster.endpoints[others[0]])
        else:
            endpoint = ",".join(host_port(cluster.endpoints[i]) for i in [leader, *others])
        gate = [worker("etcd_gate.py"), str(tmp_path)]
        start(nodes, tmp_path, etcd_args(endpoint, "2", "minority"), gate, gate)
        ready = [tmp_path / f"ready{r}" for r in (0, 1)]
        wait_while_running(nodes, lambda: all(p.exists() for p in ready), "both workers")
        cluster.stop_member(leader)
        # Run on for two lease TTLs: each agent must renew its lease and keep watching
        # through the election (and the failover), or the other would see it lost.
        time.sleep(8)
        (tmp_path / "go").touch()
        assert [n.finish(HANG) for n in nodes] == [0, 0], stderr_of(nodes)
    assert sorted(n.stdout.strip() for n in nodes) == [
        "[rank0]: world=2 sum=3 restart=0",
        "[rank1]: world=2 sum=3 restart=0",
    ]
    for node in nodes:
        assert "was lost" not in node.stderr and "restarting" not in node.stderr, node.stderr
        if endpoints == "leader-first":
            assert "now using" in node.stderr  # it did fail over


def test_losing_all_of_etcd_stops_workers_and_agents_with_a_rendezvous_error(
    etcd: EtcdCluster, nodes: list[Node], tmp_path: Path
) -> None:
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    tail = [worker("sleep_tree.py"), str(pids_dir)]
    start(nodes, tmp_path, etcd_args(host_port(etcd.endpoints[0]), "2", "all-gone"), tail, tail)
    wait_while_running(nodes, lambda: len(read_pids(pids_dir)) == 4, "all workers and children")
    pids = read_pids(pids_dir)
    try:
        etcd.stop()  # every member, by PID
        # heartbeat_timeout (8 s) + stopping the workers + closing: 90 s only catches a hang
        assert [n.finish(90) for n in nodes] == [1, 1], stderr_of(nodes)
        wait_for(lambda: not any(alive(pid) for pid in pids), 10, "every worker to be gone")
        for node in nodes:
            assert "Traceback" not in node.stderr, node.stderr
            last = node.stderr.strip().splitlines()[-1]
            assert last.startswith("phalanx: ") and "rendezvous store" in last, last
            assert "no etcd endpoint answered" in last and host_port(etcd.endpoints[0]) in last
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def start_and_kill(
    etcd: EtcdCluster, nodes: list[Node], tmp: Path, nnodes: str, killed: int
) -> tuple[Node, str, dict[str, dict[str, int]]]:
    """Start two agents running ``etcd_elastic.py`` (tags a, b), wait for their all-reduce,
    SIGKILL the agent of node rank ``killed`` (only the agent: no goodbye; its guardian says
    it died, ``tests/agent/test_last_word.py``); return the survivor, its tag and what each worker
    recorded."""
    args = etcd_args(host_port(etcd.endpoints[0]), nnodes, "elastic", max_restarts=1)
    start(
        nodes,
        tmp,
        [*args, "--allow-per-node-args"],  # each node's worker is given its own tag
        [worker("etcd_elastic.py"), str(tmp), "a"],
        [worker("etcd_elastic.py"), str(tmp), "b"],
    )
    first = {tag: tmp / f"{tag}-0.json" for tag in "ab"}
    wait_while_running(nodes, lambda: all(p.exists() for p in first.values()), "the all-reduce")
    seen = {tag: json.loads(p.read_text()) for tag, p in first.items()}
    assert sorted(s["node"] for s in seen.values()) == [0, 1] and seen["a"]["world"] == 2
    victim = 0 if seen["a"]["node"] == killed else 1
    nodes[victim].proc.kill()
    return nodes[1 - victim], "ab"[1 - victim], seen


def workers_gone(seen: dict[str, dict[str, int]]) -> None:
    wait_for(
        lambda: not any(alive(s["pid"]) for s in seen.values()),
        10,
        "both first-round workers (the dead agent's included) to be gone",
    )


@pytest.mark.parametrize("killed", [0, 1], ids=["store-host", "other"])
def test_sigkilled_agent_is_lost_and_the_other_goes_on_alone(
    etcd: EtcdCluster, nodes: list[Node], tmp_path: Path, killed: int
) -> None:
    """``--nnodes 1:2 --max-restarts 1``: a lost node is a failure of the job, as with c10d:
    it spends the restart, and the survivor re-forms alone (1 >= MIN) with a fresh workers'
    store. Node ``killed`` is the one whose worker hosts that store (rank 0), or the other."""
    survivor, tag, seen = start_and_kill(etcd, nodes, tmp_path, "1:2", killed)
    assert survivor.finish(HANG) == 0, stderr_of(nodes)
    assert f"node {killed} was lost" in survivor.stderr and DIED_REASON in survivor.stderr
    again = json.loads((tmp_path / f"{tag}-1.json").read_text())
    assert (again["node"], again["world"]) == (0, 1)
    assert again["master_port"] != seen[tag]["master_port"]
    assert survivor.stdout.strip().endswith("world=1 restart=1 node=0")
    workers_gone(seen)


def test_sigkilled_agent_with_min_two_stops_the_other_cleanly(
    etcd: EtcdCluster, nodes: list[Node], tmp_path: Path
) -> None:
    """``--nnodes 2``: with one node left the job cannot go on, restarts or not."""
    survivor, _, seen = start_and_kill(etcd, nodes, tmp_path, "2", killed=1)
    assert survivor.finish(HANG) == 1, stderr_of(nodes)
    assert "node 1 was lost" in survivor.stderr and "Traceback" not in survivor.stderr
    # the reason the job ended is one line (the run's keys are removed after it is said)
    why = [line for line in survivor.stderr.splitlines() if "at least 2 needed" in line]
    assert why and all(line.startswith("phalanx: ") for line in why), survivor.stderr
    workers_gone(seen)
