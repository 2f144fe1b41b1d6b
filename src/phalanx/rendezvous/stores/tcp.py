"""``KVStore`` over ``torch.distributed.TCPStore``, hosting or client.

The agents no longer use it (c10d and static run on ``agentstore``, which needs no torch
and authenticates every connection); it stays so that torch's store can be driven through
the same contract, side by side with the agent store (benchmarks, the contract tests).

How TCPStore's API maps onto the contract:

- ``get``: TCPStore's own ``get`` blocks until the key exists (up to the store timeout), so
  we ask ``compare_set(key, SENTINEL, SENTINEL)`` instead: for an absent key with a
  non-empty expected value the server returns the expected value and writes nothing; for a
  present key it returns the value. One round trip, never blocks.
- ``compare_set``: the server compares bytes, treats ``expected=b""`` as "absent", and, for
  an absent key with another expected value, answers that expected value unchanged.
  ``_compare_set`` below decodes those answers (one extra ``check`` in the single ambiguous
  case ``expected == desired``).
- ``set``: TCPStore sends SET without an acknowledgement; we follow it with ``check`` on the
  same connection so that it has been applied when ``set`` returns (otherwise another
  connection's read right afterwards can miss it: measured at about 3 in 10,000 here).
- ``wait``: TCPStore's timed wait logs two C++ warnings every time it times out, and holds
  the connection's lock for the whole wait; we poll ``check`` with a short backoff instead, so
  a waiting thread never holds up the heartbeat thread and nothing is printed.

torch is imported only by the two constructors, so importing this module is cheap.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from phalanx.rendezvous.stores.base import StoreUnavailable
from phalanx.rendezvous.stores.reach import wait_reachable

_SENTINEL = b"\x00phalanx:absent\x00"  # never written: rendezvous values are JSON or digits
_POLL_FIRST = 0.01
_POLL_MAX = 0.2

T = TypeVar("T")


class TcpKVStore:
    """A ``KVStore`` on one TCPStore connection (TCPStore serializes calls on it)."""

    def __init__(self, store: Any, *, where: str, hosting: bool) -> None:
        """Wrap a connected ``TCPStore``; ``where`` names it in error messages."""
        self._store: Any = store
        self.where = where
        self.hosting = hosting

    @classmethod
    def host(cls, host: str, port: int, *, read_timeout: float) -> TcpKVStore:
        """Serve a store on ``port`` (all interfaces; 0 picks a free port); raises on a busy port."""
        from torch.distributed import TCPStore

        store = TCPStore(
            host,
            port,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=read_timeout),
        )
        return cls(
            store, where=f"the rendezvous store this node hosts on port {store.port}", hosting=True
        )

    @classmethod
    def connect(
        cls, host: str, port: int, *, connect_timeout: float, read_timeout: float
    ) -> TcpKVStore:
        """Connect to a store, retrying until ``connect_timeout`` (its host may start later)."""
        from torch.distributed import TCPStore

        where = f"the rendezvous store at {_hostport(host, port)}"
        # Wait here, where a signal can end the wait and the reason is said, rather than
        # in TCPStore's connect loop, which does neither.
        left = wait_reachable(host, port, connect_timeout, "the rendezvous store")
        try:
            store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=max(left, 1.0)))
        except (RuntimeError, OSError) as exc:
            raise StoreUnavailable(f"cannot connect to {where}: {exc}") from None
        store.set_timeout(timedelta(seconds=read_timeout))
        return cls(store, where=where, hosting=False)

    @property
    def port(self) -> int:
        return int(self._call(lambda s: s.port))

    def get(self, key: str) -> bytes | None:
        value = bytes(self._call(lambda s: s.compare_set(key, _SENTINEL, _SENTINEL)))
        return None if value == _SENTINEL else value

    def set(self, key: str, value: bytes) -> None:
        if not value:
            raise ValueError(
                f"empty value for {key!r}: the KVStore contract needs non-empty values"
            )
        # TCPStore sends SET without waiting for an answer, so a read on another connection
        # could still miss it; a round trip on this connection (served in order) makes the
        # write visible to everyone before ``set`` returns, as the contract says.
        self._call(lambda s: (s.set(key, value), s.check([key])))

    def add(self, key: str, amount: int) -> int:
        return int(self._call(lambda s: s.add(key, amount)))

    def compare_set(
        self, key: str, expected: bytes | None, desired: bytes
    ) -> tuple[bool, bytes | None]:
        if not desired or expected == b"":
            raise ValueError("compare_set needs non-empty values (empty means absent to TCPStore)")
        answer = bytes(self._call(lambda s: s.compare_set(key, expected or b"", desired)))
        if expected is None:
            # Absent -> written, answer == desired; present -> the value (== desired only if it
            # already was: the ambiguity the contract allows).
            return answer == desired, answer
        if expected == desired:
            exists = bool(self._call(lambda s: s.check([key])))
            return (True, answer) if exists else (False, None)
        if answer == desired:
            return True, answer
        if answer == expected:
            return False, None  # the server's answer for an absent key
        return False, answer

    def delete(self, key: str) -> bool:
        return bool(self._call(lambda s: s.delete_key(key)))

    def wait(self, keys: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        pause = _POLL_FIRST
        while True:
            if self._call(lambda s: s.check(keys)):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, _POLL_MAX)

    def close(self) -> None:
        # Dropping the last reference closes the socket; for the host it stops the server.
        self._store = None

    def _call(self, op: Callable[[Any], T]) -> T:
        store = self._store
        if store is None:
            raise StoreUnavailable(f"{self.where}: closed")
        try:
            return op(store)
        except (RuntimeError, OSError) as exc:
            raise StoreUnavailable(f"{self.where}: {exc}") from None


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
