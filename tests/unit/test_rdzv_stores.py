"""The ``KVStore`` contract, checked the same way on the in-memory store, on the agent store
and on a real TCPStore (each hosted here on a free loopback port, used through a second
client connection)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from phalanx.rendezvous.stores.agentstore import AgentKVStore, Token
from phalanx.rendezvous.stores.base import KVStore, StoreUnavailable
from phalanx.rendezvous.stores.tcp import TcpKVStore
from support.memory_store import MemoryServer, MemoryStore

HANG = 30.0


@pytest.fixture(params=["memory", "agent", "tcp"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[KVStore, KVStore]]:
    """(host, client): two handles on one store; closing the host stops the store."""
    host: KVStore
    client: KVStore
    if request.param == "memory":
        server = MemoryServer()
        host, client = MemoryStore(server, hosting=True), MemoryStore(server)
    elif request.param == "agent":
        token = Token(b"contract", "the test")
        agent_host = AgentKVStore.host("127.0.0.1", 0, token=token, read_timeout=5, linger=1)
        host = agent_host
        client = AgentKVStore.connect(
            "127.0.0.1", agent_host.port, token=token, connect_timeout=10, read_timeout=5
        )
    else:
        tcp_host = TcpKVStore.host("127.0.0.1", 0, read_timeout=5)
        host = tcp_host
        client = TcpKVStore.connect("127.0.0.1", tcp_host.port, connect_timeout=10, read_timeout=5)
    try:
        yield host, client
    finally:
        client.close()
        host.close()


def bounded(call: Callable[[], object]) -> object:
    """Run ``call`` in a thread; fail if it does not return within HANG (a blocking get)."""
    box: list[object] = []
    thread = threading.Thread(target=lambda: box.append(call()), daemon=True)
    thread.start()
    thread.join(HANG)
    assert box, "the store call blocked"
    return box[0]


def test_get_set_add_delete(pair: tuple[KVStore, KVStore]) -> None:
    host, client = pair
    assert bounded(lambda: client.get("missing")) is None  # absent: None at once, no wait
    host.set("k", b"v1")
    assert client.get("k") == b"v1"
    assert client.add("n", 2) == 2 and host.add("n", 3) == 5 and client.add("n", 0) == 5
    assert client.delete("k") is True and client.delete("k") is False
    assert client.get("k") is None


def test_set_is_visible_to_other_handles_once_it_returns(
    pair: tuple[KVStore, KVStore],
) -> None:
    """Read-after-write across connections: TCPStore does not acknowledge SET, so without a
    round trip after it a read on another connection missed the write about 3 times in 10,000."""
    host, client = pair
    for writer, reader in ((host, client), (client, host)):
        missed = [i for i in range(3000) if not _written_then_read(writer, reader, f"raw{i}")]
        assert missed == []


def _written_then_read(writer: KVStore, reader: KVStore, key: str) -> bool:
    writer.set(key, b"v")
    return reader.get(key) == b"v"


@pytest.mark.parametrize(
    ("initial", "expected", "desired", "result"),
    [
        (None, None, b"new", (True, b"new")),  # absent -> created
        (b"old", None, b"new", (False, b"old")),  # present, expected absent
        (b"old", b"old", b"new", (True, b"new")),  # match -> swapped
        (b"old", b"other", b"new", (False, b"old")),  # mismatch -> current value
        (None, b"other", b"new", (False, None)),  # absent, expected a value
        (None, b"same", b"same", (False, None)),  # absent, expected == desired
        (b"same", b"same", b"same", (True, b"same")),  # present == expected == desired
    ],
)
def test_compare_set(
    pair: tuple[KVStore, KVStore],
    initial: bytes | None,
    expected: bytes | None,
    desired: bytes,
    result: tuple[bool, bytes | None],
) -> None:
    host, client = pair
    if initial is not None:
        host.set("c", initial)
    assert client.compare_set("c", expected, desired) == result
    assert client.get("c") == result[1]


def test_wait(pair: tuple[KVStore, KVStore]) -> None:
    host, client = pair
    host.set("a", b"1")
    assert client.wait(["a"], 0.1) is True
    assert client.wait(["a", "b"], 0.2) is False  # times out, returns False, no exception
    threading.Timer(0.3, lambda: host.set("b", b"2")).start()
    assert client.wait(["a", "b"], HANG) is True


def test_wait_does_not_hold_up_other_threads(pair: tuple[KVStore, KVStore]) -> None:
    _, client = pair
    waiter = threading.Thread(target=lambda: client.wait(["never"], 3.0))
    waiter.start()
    time.sleep(0.2)
    assert bounded(lambda: client.add("x", 1)) == 1  # the same handle, while the wait runs
    waiter.join(HANG)


def test_closed_store_is_unavailable(pair: tuple[KVStore, KVStore]) -> None:
    host, client = pair
    client.set("k", b"v")
    host.close()  # the hosting side stops serving
    deadline = time.monotonic() + HANG
    with pytest.raises(StoreUnavailable):
        while time.monotonic() < deadline:  # TCP: a write may still fit in the socket buffer
            client.add("k2", 1)
            time.sleep(0.05)
