"""An in-memory ``KVStore`` for driving the rendezvous algorithm in tests and simulations.

``MemoryServer`` holds the data; each simulated node talks to it through its own
``MemoryStore`` handle, the way each agent has its own connection to a real store. Closing a
handle cuts that node off (its calls raise ``StoreUnavailable``: a crashed or partitioned
node); closing a hosting handle stops the server for everyone (the store host is lost).
``LeasedMemoryStore`` adds etcd's leases: its ephemeral keys vanish ``lease_ttl`` seconds
after the handle is closed, the way etcd expires the lease of a process that went silent.
"""

from __future__ import annotations

import itertools
import threading
import time

from phalanx.rendezvous.stores.base import StoreUnavailable


class MemoryServer:
    """The shared data (touch ``data``/``waiters`` only under ``lock``). Waiters are woken
    per key, so N waiters cost O(1) per write."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.data: dict[str, bytes] = {}
        self.waiters: dict[str, list[threading.Event]] = {}
        self.leased: dict[str, int] = {}  # key -> the lease it is bound to
        self.leases_alive: set[int] = set()
        self._serving = True
        self._leases = itertools.count(1)

    def grant(self) -> int:
        """A new lease id."""
        with self.lock:
            lease = next(self._leases)
            self.leases_alive.add(lease)
            return lease

    def expire(self, lease: int) -> None:
        """End ``lease`` now: delete every key still bound to it (as etcd does)."""
        with self.lock:
            self.leases_alive.discard(lease)
            for key in [k for k, owner in self.leased.items() if owner == lease]:
                del self.leased[key]
                self.data.pop(key, None)

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

    def put(self, key: str, value: bytes, lease: int | None = None) -> None:
        """Write ``key``; bound to ``lease`` if given, else unbound from any lease."""
        if not value:
            raise ValueError(
                f"empty value for {key!r}: the KVStore contract needs non-empty values"
            )
        self.data[key] = value
        if lease is None:
            self.leased.pop(key, None)
        else:
            self.leased[key] = lease
        for event in self.waiters.pop(key, ()):
            event.set()


class MemoryStore:
    """One node's handle on a ``MemoryServer``; implements ``KVStore``."""

    def __init__(self, server: MemoryServer, *, hosting: bool = False) -> None:
        self._server = server
        self.hosting = hosting
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
            server.leased.pop(key, None)
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
        if self.hosting:
            self._server.stop()

    def _locked(self) -> _Locked:
        if self._closed:
            raise StoreUnavailable("this in-memory store handle is closed")
        return _Locked(self._server)


class LeasedMemoryStore(MemoryStore):
    """A ``MemoryStore`` handle with a lease; implements ``LeasedStore``.

    Closing the handle (a crash, in a simulation) lets the lease run out: its keys vanish
    ``lease_ttl`` seconds later, from a timer thread.
    """

    def __init__(self, server: MemoryServer, *, lease_ttl: float, hosting: bool = False) -> None:
        super().__init__(server, hosting=hosting)
        self.lease = server.grant()
        self._ttl = lease_ttl
        self._expiry: threading.Timer | None = None

    def set_ephemeral(self, key: str, value: bytes) -> None:
        with self._locked() as server:
            if self.lease not in server.leases_alive:
                raise StoreUnavailable(f"lease {self.lease} expired")
            server.put(key, value, lease=self.lease)

    def close(self) -> None:
        if self._expiry is None:
            self._expiry = threading.Timer(self._ttl, self._server.expire, args=(self.lease,))
            self._expiry.daemon = True
            self._expiry.start()
        super().close()


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
