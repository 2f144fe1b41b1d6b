"""etcd SIGKILLed mid-job, with the defaults: two real agents on loopback, a real etcd server
killed by its PID (no graceful stop), real workers that each hold a child. Every etcd endpoint
now refuses the connection, so each store call ends at once instead of retrying until
``request_timeout``; the agents see the store lost after their errors for two heartbeat
intervals, stop their workers and exit 1 naming the refused endpoint -- before the fence
(8 s after the last lease renewal) would have ended them. The seconds from the kill to each
agent's exit are printed (docs/how-to/etcd.md: etcd lost; not asserted: a loaded machine)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from support.etcd_server import EtcdCluster
from support.hosts import Loopback, Node
from support.launch import alive, read_pids, wait_for, worker
from support.tools import needs_etcd

pytestmark = [pytest.mark.slow, needs_etcd]

HANG = 120.0


def test_etcd_sigkilled_mid_job_ends_both_agents_on_its_refused_port(
    nodes: list[Node], tmp_path: Path
) -> None:
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    with EtcdCluster(size=1) as etcd:
        endpoint = etcd.endpoints[0].removeprefix("http://")
        args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
                "--rdzv-endpoint", endpoint, "--rdzv-id", f"killed-{os.getpid()}",
                "--max-restarts", "0", worker("sleep_tree.py"), str(pids_dir)]  # fmt: skip
        for i in range(2):
            nodes.append(Node(Loopback(), i, args, tmp_path, f"n{i}"))

        def all_up() -> bool:
            assert all(n.proc.poll() is None for n in nodes), [n.stderr for n in nodes]
            return len(read_pids(pids_dir)) == 4

        wait_for(all_up, HANG, "both workers and their children")
        pids = read_pids(pids_dir)
        try:
            member = etcd.members[0].process
            assert member is not None
            member.kill()  # SIGKILL: no goodbye on any connection
            killed = time.monotonic()
            member.wait(10)
            codes = []
            for node in nodes:
                codes.append(node.finish(HANG))
                print(f"agent exited {time.monotonic() - killed:.1f} s after etcd's SIGKILL")
            assert codes == [1, 1], [n.stderr for n in nodes]
            wait_for(lambda: not any(alive(pid) for pid in pids), 10, "every worker to be gone")
            for node in nodes:
                last = node.stderr.strip().splitlines()[-1]
                assert "Traceback" not in node.stderr, node.stderr
                assert "the rendezvous store is unreachable" in last, last
                assert "every one refused the connection" in last and endpoint in last, last
                assert "fenced" not in last, "the refused port was found before the fence"
        finally:
            for pid in pids:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
