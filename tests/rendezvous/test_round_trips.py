"""Round trips a joining node saves, over real sockets on the agent store.

``AgentKVStore.wait_get``: a ``wait`` and the reads sent behind it on one connection,
answered by the server once the wait is over (it serves a connection's requests in order
and parks the connection while its wait is open), so what a joining node waits for comes
back in the wait's own round trip (``assembly``, ``formation``). And the watch thread of a
node that joins a round makes no waits on the store until it follows the new round, whose
events it then waits for at once (``liveness``). Counted per node in a restart round:
``tests/unit/test_restart_calls.py``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import ClassVar

import pytest

from phalanx.rendezvous.api import EventKind, JobEvent, NodeInfo
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.liveness import Liveness
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.agentstore import AgentKVStore, Token
from support.launch import wait_for

TOKEN = Token(b"the job's secret", "the test")
HANG = 30.0


@pytest.fixture
def pair() -> Iterator[tuple[AgentKVStore, AgentKVStore]]:
    host = AgentKVStore.host("127.0.0.1", 0, token=TOKEN, read_timeout=5)
    other = AgentKVStore.connect(
        "127.0.0.1", host.port, token=TOKEN, connect_timeout=5, read_timeout=5
    )
    try:
        yield host, other
    finally:
        other.close()
        host.close()


def test_the_reads_behind_a_wait_see_the_write_that_ended_it(
    pair: tuple[AgentKVStore, AgentKVStore],
) -> None:
    host, other = pair
    writer = threading.Timer(0.3, lambda: host.set("r1/members", b"the members"))
    writer.start()
    try:
        found, values = other.wait_get(["r1/members"], 30.0, ["r1/members", "absent"])
    finally:
        writer.join()
    assert found and values == [b"the members", None]
    # Written already: at once; and the connection serves the next call as before.
    assert other.wait_get(["r1/members"], 30.0, ["r1/members"]) == (True, [b"the members"])
    assert other.add("served", 1) == 1


def test_a_wait_that_times_out_still_answers_its_reads(
    pair: tuple[AgentKVStore, AgentKVStore],
) -> None:
    host, other = pair
    host.set("r1/closed", b"n=2")
    found, values = other.wait_get(["r1/all_settled"], 0.2, ["r1/closed", "r1/all_settled"])
    assert not found and values == [b"n=2", None]
    assert other.get("r1/closed") == b"n=2"


class _CountedWaits(AgentKVStore):
    """An agent store handle whose twins (the watch and heartbeat threads') count waits."""

    waits: ClassVar[list[list[str]]] = []

    def twin(self, read_timeout: float) -> AgentKVStore:
        return _CountedWaits(*self._address, self._token, read_timeout=read_timeout)

    def wait(self, keys: list[str], timeout: float) -> bool:
        _CountedWaits.waits.append(keys)
        return super().wait(keys, timeout)


def test_a_joining_nodes_watch_waits_on_no_store_then_on_the_new_rounds_events(
    pair: tuple[AgentKVStore, AgentKVStore],
) -> None:
    """From ``announce`` to ``follow`` the watch thread makes no wait on the store (it read
    the old round's events with its heartbeat duties); once it follows the new round, a
    peer's event posted there reaches ``next_event``."""
    host, _ = pair
    settings = RendezvousSettings(heartbeat_interval=0.4, heartbeat_timeout=4.0)
    keys = Keys("joining")
    store = _CountedWaits("127.0.0.1", host.port, TOKEN, read_timeout=5)
    nodes = (NodeInfo(0, "a", "x", 1), NodeInfo(1, "b", "y", 1))
    liveness = Liveness(Board(store, keys, "a"), settings)
    liveness.follow(Membership(0, 0, ("a", "b"), nodes), 0)
    _CountedWaits.waits.clear()
    liveness.announce()  # as next_round does: it joins round 1
    liveness.start()
    try:
        time.sleep(4 * settings.heartbeat_interval)  # the length of the join, not a condition
        assert _CountedWaits.waits == []
        liveness.follow(Membership(1, 0, ("a", "b"), nodes), 0)
        wait_for(lambda: len(_CountedWaits.waits) > 0, HANG, "the watch to wait on the store")
        event = JobEvent(EventKind.PEER_FAILED, 1, "rank 1 failed", {"rank": 1})
        Board(host, keys, "b").post_event(1, event, about="b")
        wait_for(lambda: liveness.next_event() is not None, HANG, "the new round's event read")
        assert _CountedWaits.waits[0] == [keys.event(1, 1)]
    finally:
        liveness.stop()
        store.close()


class _BeatWriters(AgentKVStore):
    """An agent store handle whose twins note which thread wrote each heartbeat."""

    writers: ClassVar[list[threading.Thread]] = []

    def twin(self, read_timeout: float) -> AgentKVStore:
        return _BeatWriters(*self._address, self._token, read_timeout=read_timeout)

    def set(self, key: str, value: bytes) -> None:
        super().set(key, value)
        if key.endswith("/hb/a"):
            _BeatWriters.writers.append(threading.current_thread())


def test_the_heartbeats_are_written_by_a_thread_that_lives_on(
    pair: tuple[AgentKVStore, AgentKVStore],
) -> None:
    """Beats answered in time are all written by one thread (``beat.Beater``): a thread
    started per beat cost every node a thread's start a second, a thousand a second in a
    driver of ``benchmarks/store_load.py``."""
    host, _ = pair
    settings = RendezvousSettings(heartbeat_interval=0.1, heartbeat_timeout=4.0)
    store = _BeatWriters("127.0.0.1", host.port, TOKEN, read_timeout=5)
    nodes = (NodeInfo(0, "a", "x", 1), NodeInfo(1, "b", "y", 1))
    liveness = Liveness(Board(store, Keys("beats"), "a"), settings)
    liveness.follow(Membership(0, 0, ("a", "b"), nodes), 0)
    _BeatWriters.writers.clear()
    liveness.start()
    try:
        wait_for(lambda: len(_BeatWriters.writers) >= 8, HANG, "eight heartbeats")
    finally:
        liveness.stop()
        store.close()
    assert len(set(_BeatWriters.writers)) == 1, _BeatWriters.writers
