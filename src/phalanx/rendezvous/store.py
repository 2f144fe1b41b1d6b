"""The key-value store contract that dynamic rendezvous runs on.

Backends (torch's ``TCPStore`` for ``c10d``, etcd v3 for ``etcd``, an in-memory dict for
tests of the algorithm) implement this protocol; the rendezvous algorithm only ever talks
to it. Keys are ``str``; values are ``bytes``. Every call may raise ``StoreUnavailable``
when the store cannot be reached, which the agent turns into a ``RendezvousError``.
"""

from __future__ import annotations

from typing import Protocol


class StoreUnavailable(Exception):
    """The store could not be reached or did not answer within its timeout."""


class KVStore(Protocol):
    def get(self, key: str) -> bytes | None:
        """Return the value, or ``None`` when the key is absent. Never blocks waiting for it."""

    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` unconditionally."""

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer at ``key`` (absent counts as 0); return the sum."""

    def compare_set(
        self, key: str, expected: bytes | None, desired: bytes
    ) -> tuple[bool, bytes | None]:
        """Set ``key`` to ``desired`` only if its value is ``expected`` (``None``: absent).

        Returns ``(swapped, current)`` where ``current`` is the value after the call.
        """

    def delete(self, key: str) -> bool:
        """Remove ``key``; return whether it existed."""

    def wait(self, keys: list[str], timeout: float) -> bool:
        """Block until every key exists or ``timeout`` seconds pass; return whether they all exist."""

    def close(self) -> None:
        """Release connections (a hosting backend also stops serving)."""
