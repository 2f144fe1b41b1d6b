"""The two child roles of ``store_load.py``: the store's server, and a driver of many clients.

A driver holds ``--count`` real connections to the store, one rendezvous agent's handle
each, and puts on them the load that agents put on the store, by running phalanx's own code
on them rather than a model of it: ``RoundFormer.form`` (the join algorithm: joins,
compare-and-sets, waits) in one thread per client (started once, for every round), and
``Liveness`` (the heartbeat and watch threads: the wait for the next event, the heartbeat
write, and the duties' reads -- the round's counters and the ring watch's read -- in one
round trip, about once a second each on the agent store, where they run on twins as in a
real agent; the event read every quarter second elsewhere) beside the first round (an agent
starts beating as it joins its first round: ``DynamicRendezvousHandler.next_round``; with
``bare``, as this benchmark ran before session 53, from the steady state on; the threads
are started before the round's clock starts: a thousand thread starts on two cores are the
benchmark's cost, each on its own node in a job), in the steady state and beside the
restart round. Every store call but ``wait`` (which blocks by design) is timed; a
``get_many`` is one call. The parent steers the phases by lines on stdin and gets one JSON
line back per phase.
"""

from __future__ import annotations

import json
import os
import random
import resource
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.formation import RoundFormer
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.liveness import Liveness
from phalanx.rendezvous.dynamic.members import Arrival, Membership
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.agentstore import AgentKVStore, StoreServer, Token
from phalanx.rendezvous.stores.base import KVStore
from phalanx.rendezvous.stores.tcp import TcpKVStore

HOST = "127.0.0.1"
SETTINGS = RendezvousSettings(join_timeout=120.0, close_timeout=60.0)
CONNECTING = 64  # connections a driver opens at once
# How long a driver's thread may hold the interpreter lock while others want it. A driver
# holds a hundred agents' threads in one interpreter (a real agent has a handful); at the
# default 5 ms every thread that waits for the lock wakes 200 times a second to ask for it,
# and with hundreds waiting those wake-ups took more CPU than the agents (a restart round
# of 512 agents took 21 s instead of 1.4 s). An agent's threads mostly wait on sockets and
# let go of the lock there, so this changes the driver's overhead, not the agents' calls.
SWITCH_INTERVAL = 0.2


@dataclass(frozen=True)
class StoreKind:
    """How to serve a store (in the server process) and connect one client to it."""

    serve: Callable[[], tuple[object, int]]  # -> (a handle to keep alive, the port)
    connect: Callable[[int], KVStore]


def _tcp_serve() -> tuple[object, int]:
    store = TcpKVStore.host(HOST, 0, read_timeout=SETTINGS.read_timeout)
    return store, store.port


def _tcp_connect(port: int) -> KVStore:
    return TcpKVStore.connect(HOST, port, connect_timeout=30.0, read_timeout=SETTINGS.read_timeout)


def _token() -> Token:
    """The job's secret, as agents take it: the parent sets it for its children."""
    return Token(os.environ["PHALANX_RDZV_TOKEN"].encode(), "PHALANX_RDZV_TOKEN")


def _agent_serve() -> tuple[object, int]:
    server = StoreServer.start(HOST, 0, _token())
    return server, server.port


def _agent_connect(port: int) -> KVStore:
    return AgentKVStore.connect(
        HOST, port, token=_token(), connect_timeout=30.0, read_timeout=SETTINGS.read_timeout
    )


STORES: dict[str, StoreKind] = {
    "TCPStore": StoreKind(_tcp_serve, _tcp_connect),
    "agent store": StoreKind(_agent_serve, _agent_connect),
}


def raise_fd_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


class Timed:
    """A ``KVStore`` handle that records how long each call took, under the current phase."""

    def __init__(self, inner: KVStore, record: Callable[[str, float], None]) -> None:
        self.inner = inner
        self.hosting = False
        self._record = record

    def _timed(self, op: str, call: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        result = call()
        self._record(op, time.perf_counter() - start)
        return result

    def get(self, key: str) -> bytes | None:
        return self._timed("get", lambda: self.inner.get(key))  # type: ignore[no-any-return]

    def set(self, key: str, value: bytes) -> None:
        self._timed("set", lambda: self.inner.set(key, value))

    def add(self, key: str, amount: int) -> int:
        return self._timed("add", lambda: self.inner.add(key, amount))  # type: ignore[no-any-return]

    def compare_set(
        self, key: str, expected: bytes | None, desired: bytes
    ) -> tuple[bool, bytes | None]:
        return self._timed(  # type: ignore[no-any-return]
            "compare_set", lambda: self.inner.compare_set(key, expected, desired)
        )

    def delete(self, key: str) -> bool:
        return self._timed("delete", lambda: self.inner.delete(key))  # type: ignore[no-any-return]

    def wait(self, keys: list[str], timeout: float) -> bool:
        self._record("wait", -1.0)  # counted, not timed: a wait lasts until its keys exist
        return self.inner.wait(keys, timeout)

    def close(self) -> None:
        self.inner.close()


class TimedAgentStore(Timed):
    """A ``Timed`` agent store handle, with what the rendezvous finds on one: ``twin``, so
    that ``Liveness`` runs as in a real agent (its watch and heartbeat threads on handles of
    their own, the watch's wait for the next event parked on the server), ``get_many``
    (the arrivals read in one round trip: one call, one latency) and ``wait_get`` (a wait
    and the reads behind it in one round trip: one call, counted as a wait)."""

    inner: AgentKVStore

    def twin(self, read_timeout: float) -> KVStore:
        return TimedAgentStore(self.inner.twin(read_timeout), self._record)

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        return self._timed("get_many", lambda: self.inner.get_many(keys))  # type: ignore[no-any-return]

    def wait_get(
        self, keys: list[str], timeout: float, reads: list[str]
    ) -> tuple[bool, list[bytes | None]]:
        self._record("wait", -1.0)  # a wait: counted, not timed (the reads ride on it)
        return self.inner.wait_get(keys, timeout, reads)


def timed(store: KVStore, record: Callable[[str, float], None]) -> Timed:
    if isinstance(store, AgentKVStore):
        return TimedAgentStore(store, record)
    return Timed(store, record)


class Driver:
    """``count`` agents of a job of ``total``; agent ``first + i`` is this driver's i-th."""

    def __init__(
        self,
        kind: StoreKind,
        port: int,
        run_id: str,
        first: int,
        count: int,
        total: int,
        bare: bool = False,
    ) -> None:
        self.phase = "connect"
        self.bare = bare  # the first round without heartbeats (no real agent joins so)
        # phase -> op -> latencies (s; -1 for a wait). list.append is atomic: no lock needed.
        self.samples: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        self.form_ops: dict[str, int] = defaultdict(int)  # phase -> store calls by form()
        self._forming = threading.local()
        self.total = total
        # In parallel: one TCPStore connect in about 30 takes 5 s here (torch's client retries).
        with ThreadPoolExecutor(max_workers=CONNECTING) as pool:
            connected = list(pool.map(lambda _: kind.connect(port), range(count)))
        self.stores = [timed(store, self._record) for store in connected]
        keys = Keys(run_id)
        self.agents = []
        for i, store in enumerate(self.stores):
            node_id = uuid.uuid4().hex
            board = Board(store, keys, node_id)
            arrival = Arrival(node_id, f"node{first + i}", HOST, local_world_size=8)
            self.agents.append((board, arrival))
        self.memberships: list[tuple[Membership, int] | None] = [None] * count
        self.liveness: list[Liveness] = []
        self._starting: list[threading.Timer] = []
        # A thread per agent for its joins, started here and kept for every round: an agent
        # joins from its own main thread, so a thread started per join is the benchmark's
        # cost, not phalanx's (a thousand thread starts in each round).
        self._joiners = ThreadPoolExecutor(max_workers=count)
        started = threading.Barrier(count + 1, timeout=60.0)
        for _ in range(count):
            self._joiners.submit(started.wait)
        started.wait()
        if not bare:  # beating before the first round, as agents join it (``next_round``)
            self._start_liveness()
            for start in self._starting:  # the threads' starts, a thousand on two cores here
                start.join()  # but each on its own node in a job, are not the round's time

    def _record(self, op: str, seconds: float) -> None:
        self.samples[self.phase][op].append(seconds)
        if getattr(self._forming, "on", False):
            self.form_ops[self.phase] += 1

    def form_round(self) -> None:
        """Every agent joins the next round at once (rejoining, after the first), as
        ``next_round`` does, while the heartbeat threads (if started) go on: each agent's
        ``Liveness`` hears of the join (``announce``) and then follows the new round."""
        errors: list[BaseException] = []

        def join(i: int) -> None:
            self._forming.on = True
            board, arrival = self.agents[i]
            former = RoundFormer(board, SETTINGS, self.total, self.total)
            prior = self.memberships[i]
            liveness = self.liveness[i] if self.liveness else None
            try:
                if liveness is not None:
                    liveness.announce()
                membership, rank, _ = former.form(
                    arrival, prior[0] if prior else None, prior[1] if prior else None
                )
                self.memberships[i] = (membership, rank)
                if liveness is not None:
                    liveness.follow(membership, rank)
            except BaseException as exc:
                errors.append(exc)

        for done in [self._joiners.submit(join, i) for i in range(len(self.agents))]:
            done.result()
        if errors:
            raise errors[0]

    def start_heartbeats(self) -> None:
        """The steady state: every agent's heartbeat and watch threads on (started with the
        first round, unless ``bare``)."""
        if not self.liveness:
            self._start_liveness()

    def _start_liveness(self) -> None:
        """Start every agent's heartbeat thread, each at a random point of one heartbeat
        interval: real agents' threads start when each agent did, seconds apart, so their
        ticks are spread out; started together they would all tick in the same instant.
        Before the first round it only beats (until ``follow``)."""
        for (board, _), joined in zip(self.agents, self.memberships, strict=True):
            liveness = Liveness(board, SETTINGS)
            if joined is not None:
                liveness.follow(*joined)
            self.liveness.append(liveness)
        for liveness in self.liveness:
            start = threading.Timer(random.uniform(0, SETTINGS.heartbeat_interval), liveness.start)
            start.start()
            self._starting.append(start)

    def stop(self) -> None:
        for start in self._starting:
            start.join()  # so that no thread starts after its Liveness was stopped
        for liveness in self.liveness:
            liveness.stop()
        for store in self.stores:
            store.close()
        self._joiners.shutdown(wait=False)


def drive(
    kind: str, port: int, run_id: str, first: int, count: int, total: int, bare: bool
) -> None:
    """The driver's side of the line protocol (see ``store_load.Children``)."""
    raise_fd_limit()
    threading.stack_size(512 * 1024)  # hundreds of threads; they need little stack
    sys.setswitchinterval(SWITCH_INTERVAL)
    driver = Driver(STORES[kind], port, run_id, first, count, total, bare)
    print("ready", flush=True)
    for line in sys.stdin:
        phase = line.strip()
        driver.phase = phase
        if phase.startswith("round"):
            driver.form_round()
        elif phase == "steady":
            driver.start_heartbeats()
        elif phase == "stop":
            driver.stop()
            samples = {p: ops for p, ops in driver.samples.items() if p not in ("connect", "stop")}
            print(json.dumps({"samples": samples, "form_ops": driver.form_ops}), flush=True)
            return
        print(phase, flush=True)  # done (a round formed; heartbeats started)


def serve(kind: str) -> None:
    """Serve a store, print its port, keep serving until stdin closes."""
    raise_fd_limit()
    handle, port = STORES[kind].serve()
    print(port, flush=True)
    sys.stdin.read()
    del handle


if __name__ == "__main__":
    role, name, *rest = sys.argv[1:]
    if role == "serve":
        serve(name)
    else:
        port_, run_id_, first_, count_, total_, first_round = rest
        drive(
            name, int(port_), run_id_, int(first_), int(count_), int(total_), first_round == "bare"
        )
    os._exit(0)  # no waiting on a daemon heartbeat thread stuck on a dead store
