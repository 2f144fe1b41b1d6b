"""Simulate a big multi-node job: N rendezvous handlers (threads) on one in-memory store.

Counts store operations per agent -- the rendezvous must cost O(1) operations per agent per
round, not O(N) -- and times each phase. The agents' own work is simulated (nothing runs
between rounds), so the times are the rendezvous' overhead on this machine's Python.

    python benchmarks/rdzv_sim.py [--nodes 1024] [--late 24]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

# phalanx's source, and the tests' in-memory store (a fake: it is not shipped in src/).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "tests"))

from phalanx.rendezvous.api import EventKind
from phalanx.rendezvous.dynamic.handler import DynamicRendezvous
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import StoreUnavailable
from support.memory_store import MemoryServer, MemoryStore


class CountingStore:
    """One agent's store handle that counts calls: the agent's own vs its heartbeat thread's."""

    def __init__(self, server: MemoryServer) -> None:
        self.inner = MemoryStore(server)
        self.hosting = False
        self.main = 0
        self.background = 0
        self.cut = False  # a crashed agent: every call fails

    def _count(self) -> None:
        if self.cut:
            raise StoreUnavailable("simulated crash")
        if threading.current_thread().name.startswith("phalanx-rdzv"):
            self.background += 1
        else:
            self.main += 1

    def get(self, key: str) -> bytes | None:
        self._count()
        return self.inner.get(key)

    def set(self, key: str, value: bytes) -> None:
        self._count()
        self.inner.set(key, value)

    def add(self, key: str, amount: int) -> int:
        self._count()
        return self.inner.add(key, amount)

    def compare_set(
        self, key: str, expected: bytes | None, desired: bytes
    ) -> tuple[bool, bytes | None]:
        self._count()
        return self.inner.compare_set(key, expected, desired)

    def delete(self, key: str) -> bool:
        self._count()
        return self.inner.delete(key)

    def wait(self, keys: list[str], timeout: float) -> bool:
        self._count()
        return self.inner.wait(keys, timeout)

    def close(self) -> None:
        self.inner.close()


class Agent:
    def __init__(
        self, i: int, server: MemoryServer, nnodes: tuple[int, int], settings: RendezvousSettings
    ) -> None:
        self.store = CountingStore(server)
        self.handler = DynamicRendezvous(
            self.store, run_id="sim", min_nodes=nnodes[0], max_nodes=nnodes[1],
            addr=f"10.0.{i // 256}.{i % 256}", hostname=f"node{i}", settings=settings,
        )  # fmt: skip


def rendezvous(agents: list[Agent], title: str) -> None:
    """All ``agents`` call next_round at once; report the time and their store operations."""
    before = [a.store.main for a in agents]
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_join, args=(a, errors)) for a in agents]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - start
    if errors:
        raise errors[0]
    ops = [a.store.main - b for a, b in zip(agents, before, strict=True)]
    rounds = {a.handler._membership.round for a in agents if a.handler._membership}
    print(
        f"{title:<44} {took:7.2f} s   ops/agent mean {statistics.mean(ops):5.1f}  "
        f"median {statistics.median(ops):4.0f}  max {max(ops):5d}   round {sorted(rounds)}"
    )


def _join(agent: Agent, errors: list[BaseException]) -> None:
    try:
        agent.handler.next_round(8)
    except BaseException as exc:
        errors.append(exc)


def until_all_see(
    agents: list[Agent], kind: EventKind, title: str, action: Callable[[], None]
) -> None:
    """Run ``action``, then poll every agent (as their monitor loops would) until all saw ``kind``."""
    bg_before = sum(a.store.background for a in agents)
    waiting = set(range(len(agents)))
    start = time.perf_counter()
    action()
    while waiting:
        for i in list(waiting):
            event = agents[i].handler.poll()
            if event is not None and event.kind is kind:
                waiting.discard(i)
        time.sleep(0.01)
    took = time.perf_counter() - start
    bg = (sum(a.store.background for a in agents) - bg_before) / len(agents) / took
    print(f"{title:<44} {took:7.2f} s   background ops/agent/s {bg:5.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--late", type=int, default=24, help="nodes that join a running job")
    args = parser.parse_args()
    n, late = args.nodes, args.late
    settings = RendezvousSettings(join_timeout=600, heartbeat_interval=1.0, heartbeat_timeout=10.0)
    print(f"{n} simulated agents, one in-memory store; {settings}")

    server = MemoryServer()
    agents = [Agent(i, server, (n - late, n), settings) for i in range(n)]
    rendezvous(agents, "round 0: all N present (MAX: no last call)")
    until_all_see(
        agents[1:], EventKind.PEER_FAILED, "failure on one node -> seen by all others",
        lambda: agents[0].handler.report_failure({"rank": 0, "exit_code": 1}),
    )  # fmt: skip
    claims = {a.handler.claim_restart(3) for a in agents}
    print(f"{'claim_restart on every node':<44} agreed: {claims}")
    rendezvous(agents, "restart round: all rejoin")
    gone = agents.pop()
    until_all_see(
        agents, EventKind.NODE_LOST, "one node crashes -> NODE_LOST seen by all",
        lambda: setattr(gone.store, "cut", True),
    )  # fmt: skip
    rendezvous(agents, f"re-rendezvous of the {n - 1} survivors")
    for a in [*agents, gone]:
        a.handler.shutdown()

    server = MemoryServer()
    elastic = [Agent(i, server, (n // 2, n), settings) for i in range(n)]
    rendezvous(elastic[: n - late], f"elastic {n // 2}:{n}, {n - late} present (last call)")
    joiners = elastic[n - late :]
    threads = [threading.Thread(target=_join, args=(a, [])) for a in joiners]
    until_all_see(
        elastic[: n - late], EventKind.NODE_WAITING, f"{late} late nodes -> NODE_WAITING seen",
        lambda: [t.start() for t in threads],
    )  # fmt: skip
    late_before = [a.store.main for a in joiners]
    rendezvous(elastic[: n - late], f"scale-up round ({n - late} running + {late} late)")
    for t in threads:
        t.join()
    late_ops = [a.store.main - b for a, b in zip(joiners, late_before, strict=True)]
    print(
        f"{'  (late joiners, ops while queued + joining)':<44} mean {statistics.mean(late_ops):5.1f}"
    )
    print(
        f"members now: {elastic[0].handler._membership.count if elastic[0].handler._membership else 0}"
    )
    for a in elastic:
        a.handler.shutdown()


if __name__ == "__main__":
    main()
