"""torchrun's most common multi-node command, word for word, on two real hosts (network
namespaces, ``tests/support/netns.py``): no --rdzv-backend and no --rdzv-endpoint, so the
static rendezvous at --master-addr:--master-port, torchrun's default. On one machine phalanx's
old default (c10d, each host serving its own localhost:29400) met by accident; on two hosts
it never did."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from phalanx.resources.ports import free_port
from support.launch import PHALANX, worker

HANG = 240  # seconds: only catches a hang


@pytest.fixture
def two_hosts(netns: Any) -> Iterator[Any]:
    yield netns(2)


def test_the_classic_static_command_forms_a_world_of_two(two_hosts: Any, tmp_path: Path) -> None:
    """torchrun's most common multi-node command, word for word, on two hosts: no
    --rdzv-backend, no --rdzv-endpoint; node 0 hosts the store at --master-addr:--master-port.
    (phalanx's old default, c10d on each host's own localhost:29400, never met.)"""
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in (0, 1):
            argv = [*PHALANX, "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1",
                    "--master-addr", two_hosts.addr(0), "--master-port", str(port),
                    "--log-dir", str(tmp_path / f"logs{rank}"), worker("flaky_dist.py")]  # fmt: skip
            with open(tmp_path / f"n{rank}.out", "wb") as out:
                procs.append(
                    subprocess.Popen(
                        two_hosts.command(rank, argv),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=dict(os.environ, GLOO_SOCKET_IFNAME="eth0"),
                        start_new_session=True,
                    )
                )
        codes = [p.wait(HANG) for p in procs]
        logs = [(tmp_path / f"n{r}.out").read_text() for r in (0, 1)]
        assert codes == [0, 0], logs
        worlds = sorted(line for text in logs for line in text.splitlines() if "world=" in line)
        assert worlds == [
            "[rank0]: world=2 sum=3 restart=0 rank=0 node=0",
            "[rank1]: world=2 sum=3 restart=0 rank=1 node=1",
        ], logs
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(10)
