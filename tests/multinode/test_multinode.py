"""Multi-node jobs through the real CLI: one phalanx agent per host (network namespaces where
they can be made, else loopback), real TCPStore, real Gloo between the hosts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from phalanx.events import read_events
from phalanx.resources.ports import free_port
from support.hosts import Node
from support.launch import alive, read_pids, wait_for, worker
from support.multinode import FAST, Hosts, c10d_args


def test_two_node_job(hosts: object, nodes: list[Node], tmp_path: Path) -> None:
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    for i in (0, 1):
        nodes.append(
            Node(net, i, [*c10d_args(net, port, "2"), worker("flaky_dist.py")], tmp_path, f"n{i}")
        )
    assert [n.finish() for n in nodes] == [0, 0], nodes[1].stderr
    lines = sorted(n.stdout.strip() for n in nodes)
    assert lines == [
        "[rank0]: world=2 sum=3 restart=0 rank=0 node=0",
        "[rank1]: world=2 sum=3 restart=0 rank=1 node=1",
    ]
    for node in nodes:  # the store's host stayed until both had left: a quiet exit barrier
        assert "not every node finished" not in node.stderr
        assert "recvVector failed" not in node.stderr


def test_a_failure_after_the_other_node_finished_fails_the_job_on_both(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """Node 0's workers finish, then node 1's rank fails: finished workers do not run again,
    so there is no restart; both nodes print the report naming rank 1 and exit non-zero."""
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    shared = tmp_path / "shared"
    shared.mkdir()
    for i in (0, 1):
        args = [*c10d_args(net, port, "2"), "--max-restarts", "1",
                worker("fail_after_others.py"), str(shared)]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    codes = [n.finish() for n in nodes]
    assert 0 not in codes, nodes[0].stderr + nodes[1].stderr
    assert codes[0] == 5, nodes[0].stderr  # node 0 exits with the root cause's code
    assert "the job failed after this node's workers finished" in nodes[0].stderr
    assert "Root cause: rank 1 (local rank 0)" in nodes[0].stderr
    assert "exit code 5" in nodes[0].stderr
    # Node 1 was refused the restart (node 0 had finished): its own report, exit 5. In the
    # rarer order (node 1 claimed the restart first) node 0 stops the job instead.
    assert (
        "not restarting: a node of this round had already finished" in nodes[1].stderr
        or "the job stopped" in nodes[1].stderr
    ), nodes[1].stderr
    for node in nodes:
        assert "recvVector failed" not in node.stderr


def test_ctrl_c_while_waiting_for_the_other_node_to_finish(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """Node 1's workers finished; its launcher waits for node 0's (the exit barrier, up to
    exit_barrier_timeout). SIGINT ends that wait at once (exit 130); node 0 then finishes."""
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    shared = tmp_path / "shared"
    shared.mkdir()
    conf = FAST.replace("exit_barrier_timeout=30", "exit_barrier_timeout=600")
    for i in (0, 1):
        args = [*c10d_args(net, port, "2", conf=conf), worker("finish_unless_rank0.py"),
                str(shared)]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    wait_for(lambda: "all 1 workers finished" in nodes[1].stderr, 90, "node 1's workers to end")
    nodes[1].proc.send_signal(signal.SIGINT)
    assert nodes[1].finish(timeout=30) == 130, nodes[1].stderr
    (shared / "go").touch()
    assert nodes[0].finish() == 0, nodes[0].stderr
    assert nodes[0].stdout == "[rank0]: done 0\n"


def test_worker_failure_on_node_1_restarts_everywhere(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    for i in (0, 1):
        args = [*c10d_args(net, port, "2"), "--max-restarts", "1", worker("flaky_dist.py"), "1"]
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    assert [n.finish() for n in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    # Both nodes restarted together: the job-wide count is 1 on each, and the job finished.
    # (node ranks follow arrival: which host got node rank 0 is not fixed)
    both = nodes[0].stdout + nodes[1].stdout
    assert "[rank0]: world=2 sum=3 restart=1 rank=0 node=0" in both, both
    assert "[rank1]: world=2 sum=3 restart=1 rank=1 node=1" in both, both
    assert any("workers failed on node 1" in n.stderr for n in nodes), both


@contextlib.contextmanager
def _sleeping_job(
    net: Hosts, nodes: list[Node], tmp_path: Path, rdzv: Callable[[int], list[str]]
) -> Iterator[None]:
    """Both nodes run ``sleep_tree.py`` (a worker with a child each) with the flags
    ``rdzv(node)``; the block kills what its test kills. After it, every worker and child
    on both nodes must be gone within 10 s; whatever is left is killed."""
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    for i in (0, 1):
        args = [*rdzv(i), worker("sleep_tree.py"), str(pids_dir)]
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    wait_for(lambda: len(read_pids(pids_dir)) == 4, 90, "both nodes' workers and children")
    pids = read_pids(pids_dir)
    try:
        yield
        wait_for(
            lambda: not any(alive(pid) for pid in pids), 10, "every worker on both nodes to be gone"
        )
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_kill_9_of_node_1_agent_stops_node_0(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    with _sleeping_job(net, nodes, tmp_path, lambda i: c10d_args(net, port, "2")):
        nodes[1].proc.kill()  # SIGKILL to node 1's agent only
        code = nodes[0].finish(timeout=60)  # heartbeat_timeout is 4 s; 60 s only catches a hang
        assert code == 1
        assert "node 1 was lost" in nodes[0].stderr, nodes[0].stderr


def test_kill_9_of_the_store_host_ends_the_other_node_with_a_rendezvous_error(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """docs/tutorials/first-multinode.md, "Store host lost": the c10d store lives in node 0's agent (on namespaces the
    endpoint names node 0's machine; is_host says so on loopback too, where both would).
    SIGKILL that agent: node 1 stops its workers and exits 1 naming the lost store."""
    net = hosts(2)  # type: ignore[operator]
    port = free_port()

    def rdzv(i: int) -> list[str]:
        return c10d_args(net, port, "2", conf=f"{FAST},is_host={'true' if i == 0 else 'false'}")

    with _sleeping_job(net, nodes, tmp_path, rdzv):
        nodes[0].proc.kill()  # SIGKILL to the store's host only
        code = nodes[1].finish(timeout=60)  # heartbeat_timeout is 4 s; 60 s only catches a hang
        assert code == 1, nodes[1].stderr
        # One line names the store (what follows it, "Broken pipe" or a reset, is the kernel's).
        lost = f"the rendezvous store is unreachable: the rendezvous store at {net.addr(0)}:{port}"
        assert lost in nodes[1].stderr, nodes[1].stderr
        assert (
            "rank 1 (local rank 0)" in nodes[1].stderr and "stopped by phalanx" in nodes[1].stderr
        )


def test_late_joiner_is_admitted_without_spending_a_restart(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    args = [*c10d_args(net, port, "1:2"), worker("late_join.py"), str(tmp_path)]
    nodes.append(Node(net, 0, args, tmp_path, "n0"))
    wait_for(lambda: (tmp_path / "alone").exists(), 90, "node 0 to start alone after the last call")
    nodes.append(Node(net, 1, args, tmp_path, "n1"))
    assert [n.finish() for n in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    assert "world=2 sum=2 restart=0" in nodes[0].stdout
    assert "world=2 sum=2 restart=0" in nodes[1].stdout
    # In node 0's event log the scale-up is a re-formed round, not a failure or a restart.
    (events_file,) = nodes[0].logs.glob("*/events.jsonl")
    kinds = [e["kind"] for e in read_events(events_file)]
    assert "reform" in kinds and "failure" not in kinds and "restart" not in kinds, kinds


def test_two_jobs_on_one_endpoint_never_mix(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """A long-lived agent store (is_host=false everywhere) serving two jobs told apart by
    --rdzv-id."""
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    code = (
        "import time\nfrom phalanx.rendezvous.stores.agentstore import NO_TOKEN, StoreServer\n"
        f"s = StoreServer.start('{net.addr(0)}', {port}, NO_TOKEN)\n"
        "print('up', flush=True)\ntime.sleep(300)\n"
    )
    store = subprocess.Popen(
        net.command(0, [sys.executable, "-c", code]),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert store.stdout is not None and store.stdout.readline().strip() == "up"
        for job in ("alpha", "beta"):
            for i in (0, 1):
                args = [
                    *c10d_args(net, port, "2", job, FAST + ",is_host=false"),
                    worker("flaky_dist.py"),
                ]
                nodes.append(Node(net, i, args, tmp_path, f"{job}{i}"))
        assert [n.finish() for n in nodes] == [0, 0, 0, 0], "".join(n.stderr for n in nodes)
        for node in nodes:  # each job formed its own world of 2
            assert "world=2 sum=3 restart=0" in node.stdout
    finally:
        os.killpg(store.pid, signal.SIGKILL)
        store.wait(10)


def test_static_backend_failure_restarts_both_nodes(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    for i in (0, 1):
        args = [
            "--rdzv-backend",
            "static",
            "--nnodes",
            "2",
            "--node-rank",
            str(i),
            "--nproc-per-node",
            "1",
            "--master-addr",
            net.addr(0),
            "--master-port",
            str(port),
            "--max-restarts",
            "1",
            "--rdzv-conf",
            FAST,
            worker("flaky_dist.py"),
            "0",
        ]
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    assert [n.finish() for n in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    assert "[rank0]: world=2 sum=3 restart=1 rank=0 node=0" in nodes[0].stdout
    assert "[rank1]: world=2 sum=3 restart=1 rank=1 node=1" in nodes[1].stdout


def test_failure_report_names_the_failing_node_on_every_node(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    for i in (0, 1):
        nodes.append(
            Node(
                net,
                i,
                [*c10d_args(net, port, "2"), worker("flaky_dist.py"), "1"],
                tmp_path,
                f"n{i}",
            )
        )
    assert [n.finish() for n in nodes] == [5, 5]
    for node in nodes:
        assert "Root cause: rank 1 (local rank 0)" in node.stderr and "(node 1)" in node.stderr, (
            node.stderr
        )
        assert "rank 1 fails on purpose" in node.stderr


def test_spawn_owner_on_two_hosts_gets_each_nodes_flags(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """TRELLIS.2 style under the CLI: one process per host that mp.spawns its own 2 workers;
    phalanx tells each its node rank and node 0's address: one world of 4."""
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    for i in (0, 1):
        args = ["--spawn-owner", "--rdzv-backend", "static", "--nnodes", "2", "--node-rank", str(i),
                "--nproc-per-node", "2", "--master-addr", net.addr(0), "--master-port", str(port),
                "--rdzv-conf", FAST, worker("trellis_owner.py")]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    assert [n.finish() for n in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    for i, node in enumerate(nodes):
        rows = sorted(
            json.loads(line.split(": ", 1)[1])["rank"] for line in node.stdout.splitlines()
        )
        assert rows == [2 * i, 2 * i + 1]  # rank = node_rank * num_gpus + local_rank
        assert all('"world": 4, "sum": 10.0' in line for line in node.stdout.splitlines())
        assert all(line.startswith(f"[node{i}]: ") for line in node.stdout.splitlines())


def test_the_store_host_is_node_0_though_started_last(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """The client (is_host=false) is started first and keeps trying the endpoint; the node
    that serves the store comes later: it is node rank 0 and its worker global rank 0 (the
    rule itself, whoever arrives first, is ``assign_ranks``'s table in test_rdzv_settings)."""
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    client = [*c10d_args(net, port, "2", conf=f"{FAST},is_host=false"), worker("flaky_dist.py")]
    nodes.append(Node(net, 1, client, tmp_path, "client"))
    wait_for(lambda: "trying" in nodes[0].stderr, 60, "the client to be trying the endpoint")
    host = [*c10d_args(net, port, "2", conf=f"{FAST},is_host=true"), worker("flaky_dist.py")]
    nodes.append(Node(net, 0, host, tmp_path, "host"))
    assert [n.finish() for n in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    assert nodes[1].stdout.strip() == "[rank0]: world=2 sum=3 restart=0 rank=0 node=0"
    assert nodes[0].stdout.strip() == "[rank1]: world=2 sum=3 restart=0 rank=1 node=1"
