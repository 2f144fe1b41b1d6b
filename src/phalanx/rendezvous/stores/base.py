"""The key-value store contract that dynamic rendezvous runs on.

Backends (the agents' own store, ``agentstore``, for ``c10d`` and ``static``, etcd v3 for
``etcd``, an in-memory dict for tests of the algorithm) implement this protocol; the
rendezvous algorithm only ever talks to it. Keys are ``str``; values are non-empty ``bytes``
(torch's TCPStore, still wrapped by ``tcp``, cannot tell an empty value from an absent key
in ``compare_set``).

Every backend is thread-safe: the rendezvous calls it from the agent's thread and from its
heartbeat thread at once, and a ``wait`` in one thread must not hold up calls in the other.
No call blocks longer than its own ``timeout`` (``wait``) or the backend's read timeout
(everything else); a call that cannot reach the store raises ``StoreUnavailable``, which the
rendezvous turns into ``EventKind.STORE_LOST`` / ``RendezvousError``.

A store with leases (etcd) also implements ``LeasedStore``; the rendezvous then uses keys
that die with their owner for liveness instead of heartbeat counters (see ``pulse``). A
store that outlives the job (etcd) also implements ``DurableStore``, so the last node to
leave can remove the run's keys. A store that reads many keys in one round trip (the agent
store) implements ``BatchedStore``; the node that assembles a round's membership reads the
arrivals with it, and a joining node reads what a wait was for in the wait's round trip.
A store that can make several conditional writes one request (etcd: a transaction)
implements ``CountingStore``; a node settles its place in a round with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable


class StoreUnavailable(Exception):
    """The store could not be reached or did not answer within its timeout."""


class StoreTimedOut(StoreUnavailable):
    """The store did not answer in time (no error: a lossy link may deliver the next call)."""


class Malformed(StoreUnavailable):
    """The store answered, with something phalanx cannot use: final, unlike an unreachable
    store (asking again would get the same junk), so the rendezvous stops at once."""


class MalformedValue(Malformed):
    """A value in the store is not what phalanx writes there (junk, a hostile or broken
    writer); the message names the key."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"the rendezvous store holds a malformed value at {key!r}: {why}")
        self.key = key


class MalformedReply(Malformed):
    """The store's server answered a request with a reply that breaks its protocol (not the
    server it claims to be, a broken proxy, a hostile peer); the message names the server and
    the request."""

    def __init__(self, server: str, request: str, why: str) -> None:
        super().__init__(f"{server} sent a malformed reply to {request}: {why}")
        self.server = server
        self.request = request


class KVStore(Protocol):
    # This handle serves the store (c10d's host agent): closing it takes the store away
    # from every node, so that node leaves last (see ``DynamicRendezvous.shutdown``).
    hosting: bool

    def get(self, key: str) -> bytes | None:
        """Return the value, or ``None`` when the key is absent. Never blocks waiting for it."""

    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` unconditionally; once this returns, every handle's ``get`` sees it."""

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer at ``key`` (absent counts as 0); return the sum."""

    def compare_set(
        self, key: str, expected: bytes | None, desired: bytes
    ) -> tuple[bool, bytes | None]:
        """Set ``key`` to ``desired`` only if its value is ``expected`` (``None``: absent).

        Returns ``(swapped, current)`` where ``current`` is the value after the call.
        A backend whose server cannot tell the cases apart (TCPStore) may report
        ``swapped=True`` when the key already held ``desired``; the rendezvous therefore
        makes every value it compare-sets unique to its writer (it embeds the node id).
        """

    def delete(self, key: str) -> bool:
        """Remove ``key``; return whether it existed."""

    def wait(self, keys: list[str], timeout: float) -> bool:
        """Block until every key exists or ``timeout`` seconds pass; return whether they all exist."""

    def close(self) -> None:
        """Release connections (a hosting backend also stops serving). Idempotent."""


@runtime_checkable
class LeasedStore(KVStore, Protocol):
    """A ``KVStore`` whose handle holds a lease that the server expires when the owner goes silent."""

    def set_ephemeral(self, key: str, value: bytes) -> None:
        """Set ``key`` bound to this handle's lease.

        The server deletes the key when the lease expires: ``lease_ttl`` seconds after the
        process stopped renewing it (it died, hung, or was cut off from the store); ``close``
        ends the lease at once. A later plain ``set`` of the key unbinds it. Raises
        ``StoreUnavailable`` once the lease has lapsed (the owner should leave the job).
        """


@runtime_checkable
class PrefixStore(KVStore, Protocol):
    """A ``KVStore`` that deletes every key under a prefix in one request (etcd: one range
    delete), where the others delete key by key."""

    def delete_prefix(self, prefix: str) -> None:
        """Delete every key that starts with ``prefix``, which ends in ``/``."""


@runtime_checkable
class RenewingStore(LeasedStore, Protocol):
    """A ``LeasedStore`` that says when its lease was renewed, so the node can fence itself
    (``phalanx.rendezvous.fencing``) before the lease can expire."""

    @property
    def lease_ttl(self) -> float:
        """The TTL asked for, in seconds (the server may only make it longer)."""

    def on_renewed(self, proved: Callable[[float], None], every: float) -> None:
        """From now on call ``proved(start)`` each time the lease is granted or renewed,
        ``start`` being the ``time.monotonic()`` at which that request was sent, and renew at
        least every ``every`` seconds. Call before the lease is first used; does no I/O."""


@runtime_checkable
class DurableStore(KVStore, Protocol):
    """A ``KVStore`` that outlives the job (etcd), so a finished run's keys must be removed."""

    def clear(self, keep: str) -> None:
        """Delete every key of this run (this handle's and every other's, receipts and leased
        keys included) except ``keep``, at once. Call it only when no node uses the run any
        more."""


@runtime_checkable
class TwinnedStore(KVStore, Protocol):
    """A store that can open a second handle on itself: its own connections, its own read
    timeout (the heartbeat thread's calls are bounded far tighter than the agent's)."""

    def twin(self, read_timeout: float) -> KVStore:
        """A new handle on the same store (closing it closes only its own connections)."""


@runtime_checkable
class BatchedStore(KVStore, Protocol):
    """A ``KVStore`` that reads many keys in one round trip, also behind a ``wait``."""

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """``[get(key) for key in keys]``, each read as a ``get`` is, in one round trip."""

    def wait_get(
        self, keys: list[str], timeout: float, reads: list[str]
    ) -> tuple[bool, list[bytes | None]]:
        """``wait(keys, timeout)``, then ``get_many(reads)`` once the wait is over (found or
        not), in the same round trip."""


@runtime_checkable
class CountingStore(KVStore, Protocol):
    """A ``KVStore`` that claims a key and counts the claim in one request."""

    def claim_counted(
        self, key: str, value: bytes, counters: list[str], total: int, full: str
    ) -> bool:
        """At once: ``compare_set(key, None, value)``; if that set it, ``add(c, 1)`` for each
        of ``counters``, and ``set(full, b"1")`` when the last one's sum reaches ``total``.
        Returns whether this call set ``key`` (False: it held a value, nothing was written).
        Raises ``StoreUnavailable`` as ``add`` does."""
