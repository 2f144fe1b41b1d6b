"""Simulated agents for the rendezvous algorithm tests: ``DynamicRendezvous`` handlers in
threads on one in-memory store (the ``cluster`` fixture in ``conftest`` makes a ``Cluster``).

Every wait is bounded by ``WAIT`` (a hang guard, never a timing assertion). A "crashed"
node is one whose store handle is closed: it can neither heartbeat nor answer.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import cast

from phalanx.rendezvous.api import (
    EventKind,
    JobEvent,
    RendezvousHandler,
    RendezvousResult,
    Round,
)
from phalanx.rendezvous.dynamic.handler import DynamicRendezvous
from phalanx.rendezvous.dynamic.joined import JoinedRound
from phalanx.rendezvous.settings import RendezvousSettings
from support.launch import wait_for
from support.memory_store import MemoryServer, MemoryStore

WAIT = 60.0
FAST = RendezvousSettings(
    join_timeout=30,
    last_call_timeout=0.5,
    close_timeout=10,
    heartbeat_interval=0.2,
    heartbeat_timeout=4.0,
    exit_barrier_timeout=10,
)


class Cluster:
    def __init__(self) -> None:
        self.server = MemoryServer()
        self.handlers: list[DynamicRendezvous] = []

    def node(
        self,
        name: str,
        *,
        nnodes: tuple[int, int] = (2, 2),
        run_id: str = "job",
        settings: RendezvousSettings = FAST,
        fixed_rank: int | None = None,
        hosting: bool = False,
        fingerprint: dict[str, str] | None = None,
    ) -> DynamicRendezvous:
        handler = DynamicRendezvous(
            MemoryStore(self.server, hosting=hosting),
            run_id=run_id,
            min_nodes=nnodes[0],
            max_nodes=nnodes[1],
            addr=f"addr-{name}",
            hostname=name,
            settings=settings,
            fixed_rank=fixed_rank,
            fingerprint=fingerprint,
        )
        self.handlers.append(handler)
        return handler

    def shutdown(self) -> None:
        for handler in self.handlers:
            handler.shutdown()


class Join:
    """``next_round`` in a thread (named ``name``, as a test that counts a thread's store
    requests needs); ``joined()`` waits for it (bounded) and re-raises; ``result()`` is the
    joined round's facts."""

    def __init__(
        self, handler: RendezvousHandler, local_world_size: int = 2, name: str | None = None
    ) -> None:
        self.value: Round | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(handler, local_world_size), name=name
        )
        self._thread.start()

    def _run(self, handler: RendezvousHandler, lws: int) -> None:
        try:
            self.value = handler.next_round(lws)
        except BaseException as exc:
            self.error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def joined(self) -> Round:
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "next_round hung"
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value

    def result(self) -> RendezvousResult:
        return self.joined().result


def rounds(*handlers: DynamicRendezvous) -> list[JoinedRound]:
    """Every handler joins the next round at once: the rounds they joined, in order."""
    joins = [Join(h) for h in handlers]
    return [cast(JoinedRound, j.joined()) for j in joins]


def join_all(handlers: Sequence[RendezvousHandler], local_world_size: int = 1) -> list[Round]:
    """Every handler (any backend's) joins the next round at once, handler ``i`` in a thread
    named ``join-<i>``: the rounds they joined, in order."""
    joins = [Join(h, local_world_size, f"join-{i}") for i, h in enumerate(handlers)]
    return [j.joined() for j in joins]


def form(*handlers: DynamicRendezvous) -> list[RendezvousResult]:
    return [r.result for r in rounds(*handlers)]


def swept(timeout: float = WAIT) -> None:
    """Until every sweep under way ended: node rank 0 sweeps the rounds before in a thread of
    its own after its round formed (``dynamic.sweep.Sweeper``), so a test that counts the
    store's keys right after a round formed waits for it first."""
    for thread in threading.enumerate():
        if thread.name == "phalanx-sweep":
            thread.join(timeout)
            assert not thread.is_alive(), "a sweep hung"


def wait_event(handler: RendezvousHandler, kind: EventKind, timeout: float = WAIT) -> JobEvent:
    """The next event of ``kind`` that ``handler`` polls (others before it are dropped)."""
    seen: list[JobEvent] = []

    def polled() -> bool:
        event = handler.poll()
        if event is not None and event.kind is kind:
            seen.append(event)
        return bool(seen)

    wait_for(polled, timeout, f"a {kind} event", every=0.02)
    return seen[0]


def crash(handler: DynamicRendezvous) -> None:
    handler._store.close()  # this node's connection only: it stops heartbeating


def agreed(results: list[RendezvousResult]) -> None:
    """Every node got the same round, membership and master; ranks are 0..n-1."""
    first = results[0]
    for r in results:
        assert (r.round, r.restart_count, r.nodes) == (
            first.round,
            first.restart_count,
            first.nodes,
        )
        assert (r.master_addr, r.master_port) == (first.master_addr, first.master_port)
    assert sorted(r.node_rank for r in results) == list(range(len(results)))
    assert first.master_addr == first.nodes[0].addr
    assert [n.node_rank for n in first.nodes] == list(range(len(results)))
