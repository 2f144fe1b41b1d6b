"""An in-memory ``KVStore`` for driving the rendezvous algorithm in tests and simulations.

``MemoryServer`` holds the data; each simulated node talks to it through its own
``MemoryStore`` handle, the way each agent has its own connection to a real store. Closing a
handle cuts that node off (its calls raise ``StoreUnavailable``: a crashed or partitioned
node); closing a hosting handle stops the server for everyone (the store host is lost).
"""

from __future__ import annotations

import threading
import time

from phalanx.rendezvous.store import StoreUnavailable


class MemoryServer:
    """The shared data (touch ``data``/``waiters`` only under ``lock``). Waiters are woken
    per key, so N waiters cost O(1) per write."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.data: dict[str, bytes] = {}
        self.waiters: dict[str, list[threading.Event]] = {}
        self._serving = True

    def stop(self) -> None:
        with self.lock:
            self._serving = False
            waiters = [event for events in self.waiters.values() for event in events]
            self.waiters.clear()
        for event in waiters:
            event.set()

    # The methods below run with self.lock held by the caller (see MemoryStore._locked).
    def check_serving(self) -> None:
        if not self._serving:
            raise StoreUnavailable("the in-memory store stopped serving")

    def put(self, key: str, value: bytes) -> None:
        if not value:
            raise ValueError(
                f"empty value for {key!r}: the KVStore contract needs non-empty values"
            )
        self.data[key] = value
        for event in self.waiters.pop(key, ()):
            event.set()


class MemoryStore:
    """One node's handle on a ``MemoryServer``; implements ``KVStore``."""

    def __init__(self, server: MemoryServer, *, hosting: bool = False) -> None:
        self._server = server
        self._hosting = hosting
        self._closed = False

    def get(self, key: str) -> bytes | None:
        with self._locked() as server:
            return server.data.get(key)

    def set(self, key: str, value: bytes) -> None:
        with self._locked() as server:
            server.put(key, value)

    def add(self, key: str, amount: int) -> int:
        with self._locked() as server:
            total = int(server.data.get(key, b"0")) + amount
            server.put(key, str(total).encode())
            return total

    def compare_set(
        self, key: str, expected: bytes | None, desired: bytes
    ) -> tuple[bool, bytes | None]:
        with self._locked() as server:
            current = server.data.get(key)
            if current != expected:
                return False, current
            server.put(key, desired)
            return True, desired

    def delete(self, key: str) -> bool:
        with self._locked() as server:
            return server.data.pop(key, None) is not None

    def wait(self, keys: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            with self._locked() as server:
                missing = next((key for key in keys if key not in server.data), None)
                if missing is None:
                    return True
                event = threading.Event()
                server.waiters.setdefault(missing, []).append(event)
            left = deadline - time.monotonic()
            if left <= 0 or not event.wait(left):
                with self._locked() as server:
                    waiters = server.waiters.get(missing, [])
                    if event in waiters:
                        waiters.remove(event)
                    return all(key in server.data for key in keys)

    def close(self) -> None:
        self._closed = True
        if self._hosting:
            self._server.stop()

    def _locked(self) -> _Locked:
        if self._closed:
            raise StoreUnavailable("this in-memory store handle is closed")
        return _Locked(self._server)


class _Locked:
    """``with``: hold the server's lock and fail if it stopped serving."""

    def __init__(self, server: MemoryServer) -> None:
        self._server = server

    def __enter__(self) -> MemoryServer:
        self._server.lock.acquire()
        try:
            self._server.check_serving()
        except BaseException:
            self._server.lock.release()
            raise
        return self._server

    def __exit__(self, *exc: object) -> None:
        self._server.lock.release()
