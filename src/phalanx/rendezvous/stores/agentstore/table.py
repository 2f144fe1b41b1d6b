"""The agent store's data and its parked waits: what each request does, apart from sockets.

Only the server's thread touches a ``Table``. A request is answered at once, except a
``wait`` whose keys are not all there: it is parked (``Park``) and its waiter is handed back
by ``woken`` once the writes of its keys have made them all exist.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from phalanx.rendezvous.stores.agentstore import wire

W = TypeVar("W", bound=Hashable)


@dataclass(frozen=True)
class Park:
    """No reply yet: the wait's keys are missing; give up after ``seconds``."""

    seconds: float


class Table(Generic[W]):
    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self._waits: dict[W, list[bytes]] = {}  # waiter -> the keys it waits for
        self._by_key: dict[bytes, set[W]] = {}  # key -> the waiters whose wait names it
        self._woken: list[W] = []

    def answer(self, fields: list[bytes], waiter: W) -> list[bytes] | Park:
        """The reply to one request, or ``Park`` (``waiter`` then waits, see ``woken``).
        Raises ``FrameError``, ``IndexError`` or ``ValueError`` on a malformed request."""
        op, data = fields[0], self.data
        if op == wire.GET:
            value = data.get(fields[1])
            return [wire.OK, wire.ABSENT] if value is None else [wire.OK, wire.PRESENT, value]
        if op == wire.SET:
            self._write(fields[1], fields[2])
            return [wire.OK]
        if op == wire.ADD:
            key, amount = fields[1], wire.decode_int(fields[2])
            old = data.get(key)
            if old is not None and not old.lstrip(b"-").isdigit():
                return [wire.ERROR, b"not an integer"]
            total = (0 if old is None else int(old)) + amount
            self._write(key, wire.encode_int(total))
            return [wire.OK, wire.encode_int(total)]
        if op == wire.COMPARE_SET:
            return self._compare_set(*fields[1:5])
        if op == wire.DELETE:
            existed = data.pop(fields[1], None) is not None
            return [wire.OK, wire.TRUE if existed else wire.FALSE]
        if op == wire.WAIT:
            timeout, keys = wire.decode_int(fields[1]) / 1000, fields[2:]
            if all(key in data for key in keys):
                return [wire.OK, wire.TRUE]
            self._waits[waiter] = keys
            for key in keys:
                self._by_key.setdefault(key, set()).add(waiter)
            return Park(max(0.0, timeout))
        if op == wire.PING:
            return [wire.OK]
        raise ValueError(f"unknown operation {op[:20]!r}")

    def woken(self) -> list[W]:
        """The waiters whose keys now all exist (each once; their waits are over)."""
        woken, self._woken = self._woken, []
        return woken

    def cancel(self, waiter: W) -> None:
        """End ``waiter``'s wait, if it has one (timed out, or its connection closed)."""
        for key in self._waits.pop(waiter, ()):
            waiting = self._by_key.get(key)
            if waiting is not None:
                waiting.discard(waiter)
                if not waiting:
                    del self._by_key[key]

    def _compare_set(
        self, key: bytes, marker: bytes, expected: bytes, desired: bytes
    ) -> list[bytes]:
        current = self.data.get(key)
        if (current is None) if marker == wire.ABSENT else (current == expected):
            self._write(key, desired)
            return [wire.OK, wire.TRUE, wire.PRESENT, desired]
        if current is None:
            return [wire.OK, wire.FALSE, wire.ABSENT]
        return [wire.OK, wire.FALSE, wire.PRESENT, current]

    def _write(self, key: bytes, value: bytes) -> None:
        self.data[key] = value
        for waiter in list(self._by_key.get(key, ())):
            if all(k in self.data for k in self._waits[waiter]):
                self.cancel(waiter)
                self._woken.append(waiter)
