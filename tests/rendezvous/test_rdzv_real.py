"""Rendezvous tier (c): real agents (``tests/workers/rdzv_agent.py`` processes) on a real
TCPStore hosted by one of them -- on loopback, and across network namespaces.

Timeouts only catch hangs; every process is ended by its own process group and proven gone.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from support.netns import NetNamespaces

HERE = Path(__file__).resolve().parents[1]
AGENT = HERE / "workers" / "rdzv_agent.py"
SRC = HERE.parent / "src"
HANG = 120.0
CONF = {
    "join_timeout": "90",
    "last_call_timeout": "1",
    "heartbeat_interval": "0.5",
    "heartbeat_timeout": "5",
    "read_timeout": "5",
    "exit_barrier_timeout": "60",
}

pytestmark = pytest.mark.slow


class Agent:
    def __init__(
        self, spec: dict[str, Any], steps: Sequence[str], prefix: Sequence[str] = ()
    ) -> None:
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        argv = [*prefix, sys.executable, str(AGENT), json.dumps(spec), *steps]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
        )
        self.lines: list[dict[str, Any]] = []
        self._buffer = b""

    def expect(self, step: str, timeout: float = HANG) -> dict[str, Any]:
        """The next printed line for ``step`` (earlier ones stay in ``lines``)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while True:
                for line in self.lines:
                    if line.get("step") == step and not line.get("_seen"):
                        line["_seen"] = True
                        return line
                left = deadline - time.monotonic()
                assert left > 0, f"no {step!r} line; stderr:\n{self.stderr_tail()}"
                if sel.select(left):
                    chunk = os.read(self.proc.stdout.fileno(), 65536)
                    assert chunk, f"agent ended before {step!r}; stderr:\n{self.stderr_tail()}"
                    self._buffer += chunk
                    *complete, self._buffer = self._buffer.split(b"\n")
                    self.lines += [json.loads(c) for c in complete if c.strip()]

    def finish(self) -> int:
        self.expect("exit")
        return self.proc.wait(HANG)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(HANG)
        with pytest.raises(ProcessLookupError):
            os.kill(self.proc.pid, 0)  # reaped: the pid is gone

    def stderr_tail(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")[-3000:]


@pytest.fixture
def agents() -> Iterator[Callable[..., Agent]]:
    started: list[Agent] = []

    def start(spec: dict[str, Any], steps: Sequence[str], prefix: Sequence[str] = ()) -> Agent:
        agent = Agent(spec, steps, prefix)
        started.append(agent)
        return agent

    try:
        yield start
    finally:
        for agent in started:
            agent.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def c10d(endpoint: str, nnodes: tuple[int, int] = (2, 2), **conf: str) -> dict[str, Any]:
    return {
        "backend": "c10d",
        "run_id": "real",
        "min_nodes": nnodes[0],
        "max_nodes": nnodes[1],
        "endpoint": endpoint,
        "conf": {**CONF, **conf},
    }


def same_round(rounds: list[dict[str, Any]]) -> None:
    first = rounds[0]
    for r in rounds:
        for field in ("round", "restart_count", "nodes", "master_addr", "master_port"):
            assert r[field] == first[field], field
    assert sorted(r["node_rank"] for r in rounds) == list(range(len(rounds)))
    assert first["master_addr"] == first["nodes"][0]["addr"]


def test_c10d_two_agents_on_loopback(agents: Callable[..., Agent]) -> None:
    port = free_port()
    spec = c10d(f"127.0.0.1:{port}")  # both may try to host: one does, the other connects
    a, b = agents(spec, ["round", "done:ok"]), agents(spec, ["round", "done:ok"])
    rounds = [a.expect("round"), b.expect("round")]
    same_round(rounds)
    assert rounds[0]["master_port"] != port  # the workers get their own fresh port
    assert [a.finish(), b.finish()] == [0, 0]


def test_c10d_failure_reach_and_job_wide_restarts(agents: Callable[..., Agent]) -> None:
    spec = c10d(f"127.0.0.1:{free_port()}")
    both = ["claim:1", "round", "await:peer_failed", "claim:1", "done:fail"]
    watcher = agents(spec, ["round", "await:peer_failed", *both])
    failing = agents(spec, ["round", "fail", "claim:1", "round", "fail", "claim:1", "done:fail"])
    first = [watcher.expect("round"), failing.expect("round")]
    same_round(first)
    event = watcher.expect("event")
    assert event["kind"] == "peer_failed" and event["node_rank"] == first[1]["node_rank"]
    assert watcher.expect("claim")["restart"] is True
    assert failing.expect("claim")["restart"] is True
    second = [watcher.expect("round"), failing.expect("round")]
    same_round(second)
    assert second[0]["round"] == 1 and second[0]["restart_count"] == 1
    assert watcher.expect("event")["kind"] == "peer_failed"
    assert watcher.expect("claim")["restart"] is False  # budget of 1 spent, on both nodes
    assert failing.expect("claim")["restart"] is False
    assert [watcher.finish(), failing.finish()] == [0, 0]


def test_c10d_lost_agent_is_noticed(agents: Callable[..., Agent]) -> None:
    port = free_port()
    host = agents(
        c10d(f"127.0.0.1:{port}", (1, 2), is_host="true"),
        ["round", "await:node_lost", "round", "done:ok"],
    )
    doomed = agents(c10d(f"127.0.0.1:{port}", (1, 2), is_host="false"), ["round", "sleep:600"])
    same_round([host.expect("round"), doomed.expect("round")])
    doomed.kill()
    assert host.expect("event")["kind"] == "node_lost"
    alone = host.expect("round")
    assert (alone["round"], len(alone["nodes"]), alone["node_rank"]) == (1, 1, 0)
    assert host.finish() == 0


def test_c10d_store_host_killed(agents: Callable[..., Agent]) -> None:
    port = free_port()
    host = agents(c10d(f"127.0.0.1:{port}", is_host="true"), ["round", "sleep:600"])
    client = agents(
        c10d(f"127.0.0.1:{port}", is_host="false"), ["round", "await:store_lost", "round_error"]
    )
    same_round([host.expect("round"), client.expect("round")])
    host.kill()
    assert "store" in client.expect("event")["detail"]
    assert client.expect("round_error")["error"]
    assert client.finish() == 0


def test_static_ranks_and_a_fresh_worker_port(agents: Callable[..., Agent]) -> None:
    port = free_port()

    def spec(rank: int) -> dict[str, Any]:
        return {
            "backend": "static",
            "run_id": "static-job",
            "min_nodes": 2,
            "max_nodes": 2,
            "node_rank": rank,
            "master_addr": "127.0.0.1",
            "master_port": port,
            "conf": CONF,
        }

    one = agents(spec(1), ["round", "done:ok"])  # starts first: waits for node 0's store
    time.sleep(1)
    zero = agents(spec(0), ["round", "done:ok"])
    rounds = [zero.expect("round"), one.expect("round")]
    same_round(rounds)
    assert [r["node_rank"] for r in rounds] == [0, 1]
    assert rounds[0]["master_addr"] == "127.0.0.1" and rounds[0]["master_port"] != port
    assert [zero.finish(), one.finish()] == [0, 0]


def test_c10d_across_network_namespaces(
    netns: Callable[[int], NetNamespaces], agents: Callable[..., Agent]
) -> None:
    hosts = netns(2)
    spec = c10d(f"{hosts.addr(0)}:29400")  # node 0's namespace has that address: it hosts
    a = agents(spec, ["round", "done:ok"], hosts.command(0, []))
    b = agents(spec, ["round", "done:ok"], hosts.command(1, []))
    rounds = [a.expect("round"), b.expect("round")]
    same_round(rounds)
    assert {r["nodes"][r["node_rank"]]["addr"] for r in rounds} == {hosts.addr(0), hosts.addr(1)}
    assert rounds[0]["nodes"][rounds[0]["node_rank"]]["addr"] == hosts.addr(0)
    assert [a.finish(), b.finish()] == [0, 0]


def test_store_host_vanishing_from_the_network(
    netns: Callable[[int], NetNamespaces], agents: Callable[..., Agent]
) -> None:
    """No reset, only silence (the host's link goes down): the peer still stops, no hang."""
    hosts = netns(2)
    spec = c10d(f"{hosts.addr(0)}:29400")
    host = agents(spec, ["round", "sleep:600"], hosts.command(0, []))
    peer = agents(spec, ["round", "await:store_lost", "round_error"], hosts.command(1, []))
    same_round([host.expect("round"), peer.expect("round")])
    hosts.cut(0)
    assert "store" in peer.expect("event")["detail"]
    assert peer.expect("round_error")["error"]
    assert peer.finish() == 0
