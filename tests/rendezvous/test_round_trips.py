"""Round trips a joining node saves, over real sockets on the agent store.

``AgentKVStore.wait_get``: a ``wait`` and the reads sent behind it on one connection,
answered by the server once the wait is over (it serves a connection's requests in order
and parks the connection while its wait is open), so what a joining node waits for comes
back in the wait's own round trip (``assembly``, ``formation``). The watch thread of a node
that joins a round asks the store nothing until it follows the new round, whose events it
then waits for at once, while the beats go on and speak for the store (``liveness``); and a
member that finds the restart round open already writes nothing to open it (``Board``).
Counted per node in a restart round: ``tests/unit/test_restart_calls.py``."""

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
from phalanx.rendezvous.stores.agentstore import AgentKVStore, StoreServer, Token
from phalanx.rendezvous.stores.base import StoreUnavailable
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
    """An agent store handle whose twins (the watch and heartbeat threads') count waits and
    reads."""

    waits: ClassVar[list[list[str]]] = []
    reads: ClassVar[list[list[str]]] = []
    calls: ClassVar[list[str]] = []  # "wait" and "read", in their order

    def twin(self, read_timeout: float) -> AgentKVStore:
        return _CountedWaits(*self._address, self._token, read_timeout=read_timeout)

    def wait(self, keys: list[str], timeout: float) -> bool:
        _CountedWaits.waits.append(keys)
        _CountedWaits.calls.append("wait")
        return super().wait(keys, timeout)

    def get(self, key: str) -> bytes | None:
        _CountedWaits.reads.append([key])
        _CountedWaits.calls.append("read")
        return super().get(key)

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        _CountedWaits.reads.append(keys)
        _CountedWaits.calls.append("read")
        return super().get_many(keys)


class _NotedBeats(AgentKVStore):
    """An agent store handle whose twins note each heartbeat that failed."""

    failed: ClassVar[list[StoreUnavailable]] = []

    def twin(self, read_timeout: float) -> AgentKVStore:
        return _NotedBeats(*self._address, self._token, read_timeout=read_timeout)

    def set(self, key: str, value: bytes) -> None:
        try:
            super().set(key, value)
        except StoreUnavailable as exc:
            _NotedBeats.failed.append(exc)
            raise


def test_a_joining_node_whose_beats_get_through_again_keeps_its_store() -> None:
    """While the node joins, its watch asks nothing, so the beats speak for the store: the
    store's server stops (a beat fails: connection refused) and serves again on its port
    before two heartbeats passed; the next beat gets through, and the store does not count
    as lost (it did when a beat's answer, unlike a pass of the watch, cleared no error:
    "unreachable" two heartbeats after the failed one, and the thread stopped)."""
    settings = RendezvousSettings(heartbeat_interval=2.0, heartbeat_timeout=30.0)
    keys = Keys("outage")
    first = StoreServer.start("127.0.0.1", 0, TOKEN)
    store = _NotedBeats("127.0.0.1", first.port, TOKEN, read_timeout=5)
    nodes = (NodeInfo(0, "a", "x", 1), NodeInfo(1, "b", "y", 1))
    liveness = Liveness(Board(store, keys, "a"), settings)
    liveness.follow(Membership(0, 0, ("a", "b"), nodes), 0)
    liveness.announce()  # as next_round does: it joins round 1
    _NotedBeats.failed.clear()
    liveness.start()
    again = None
    try:
        wait_for(lambda: _beat_at(first.port, keys), HANG, "a heartbeat")
        first.close()
        wait_for(lambda: _NotedBeats.failed, HANG, "a heartbeat to fail")
        again = StoreServer.start("127.0.0.1", first.port, TOKEN)
        wait_for(lambda: _beat_at(first.port, keys), HANG, "a heartbeat on the store again")
        time.sleep(2 * settings.heartbeat_interval)  # past when it counted as lost before
        assert liveness.store_problem() is None
    finally:
        liveness.stop()
        store.close()
        first.close()
        if again is not None:
            again.close()


def test_a_member_that_finds_the_restart_round_open_writes_nothing_to_open_it(
    pair: tuple[AgentKVStore, AgentKVStore],
) -> None:
    """The first member to rejoin opens round 1 (its ``open`` key, then the newest-round
    pointer); one that then reads the pointer at 1 (``formation``: with the job's stop, in
    one round trip) makes no call to open it (every member wrote ``open`` before: a
    thousand writes of one key in a restart of 1,024 nodes)."""
    host, other = pair
    keys = Keys("opening")
    Board(host, keys, "a").open_round(1, None, read=True)
    assert host.get(keys.round(1, "open")) == b"1" and host.get(keys.latest_round) == b"1"
    counted = _Calls("127.0.0.1", host.port, TOKEN, read_timeout=5)
    _Calls.calls.clear()
    try:
        Board(counted, keys, "b").open_round(1, other.get(keys.latest_round), read=True)
        assert counted.calls == []
        Board(counted, keys, "b").open_round(1)  # without the pointer read: its read only
        assert counted.calls == ["get"]
    finally:
        counted.close()


def _beat_at(port: int, keys: Keys) -> bool:
    """Whether node a's heartbeat is on the store at ``port`` (a connection of its own)."""
    reader = AgentKVStore("127.0.0.1", port, TOKEN, read_timeout=5)
    try:
        return reader.get(keys.heartbeat("a")) is not None
    finally:
        reader.close()


class _Calls(AgentKVStore):
    """An agent store handle that notes its calls."""

    calls: ClassVar[list[str]] = []

    def get(self, key: str) -> bytes | None:
        self.calls.append("get")
        return super().get(key)

    def set(self, key: str, value: bytes) -> None:
        self.calls.append("set")
        super().set(key, value)

    def compare_set(
        self, key: str, expected: bytes | None, desired: bytes
    ) -> tuple[bool, bytes | None]:
        self.calls.append("compare_set")
        return super().compare_set(key, expected, desired)


def test_a_joining_nodes_watch_asks_the_store_nothing_then_waits_on_the_new_rounds_events(
    pair: tuple[AgentKVStore, AgentKVStore],
) -> None:
    """From ``announce`` to ``follow`` the watch thread asks the store nothing (no wait, no
    duties: the old round's events and counters, the ring's next heartbeat), while the
    heartbeats go on; once it follows the new round its first call is the wait for that
    round's first event (no read of it before, nor the duties: they come an interval on),
    and a peer's event posted there reaches ``next_event``."""
    host, _ = pair
    settings = RendezvousSettings(heartbeat_interval=0.4, heartbeat_timeout=4.0)
    keys = Keys("joining")
    store = _CountedWaits("127.0.0.1", host.port, TOKEN, read_timeout=5)
    nodes = (NodeInfo(0, "a", "x", 1), NodeInfo(1, "b", "y", 1))
    liveness = Liveness(Board(store, keys, "a"), settings)
    liveness.follow(Membership(0, 0, ("a", "b"), nodes), 0)
    _CountedWaits.waits.clear()
    _CountedWaits.reads.clear()
    _CountedWaits.calls.clear()
    liveness.announce()  # as next_round does: it joins round 1
    liveness.start()
    try:
        beat = keys.heartbeat("a")
        wait_for(lambda: int(host.get(beat) or 0) >= 3, HANG, "three heartbeats")
        time.sleep(2 * settings.heartbeat_interval)  # the rest of the join, not a condition
        assert _CountedWaits.waits == [] and _CountedWaits.reads == []
        assert liveness.store_problem() is None
        liveness.follow(Membership(1, 0, ("a", "b"), nodes), 0)
        wait_for(lambda: len(_CountedWaits.waits) > 0, HANG, "the watch to wait on the store")
        assert _CountedWaits.calls[0] == "wait", _CountedWaits.calls
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
