"""The rendezvous keys of what one node asks and every node answers (layout in ``keys``):
stacks (``phalanx stacks``), status (``phalanx status``) and the node check's records.
``board.Board`` holds one as ``answers``."""

from __future__ import annotations

from collections.abc import Sequence

from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.stores.base import KVStore

# The most one node posts in answer to a stacks request: etcd rejects a request over 1.5 MiB,
# and the requester reads every node's answer.
STACKS_LIMIT = 256 * 1024


def cap_stacks(text: str, limit: int = STACKS_LIMIT) -> bytes:
    """``text`` as UTF-8 of at most ``limit`` bytes (never empty): when longer, cut at a
    character boundary and ended with a line saying so."""
    data = text.encode(errors="replace") or b"(empty)\n"
    if len(data) <= limit:
        return data
    note = (
        f"\n[... cut: {len(data)} bytes in all, {limit} posted; every rank's full dump is in "
        "its stacks.txt on that node]\n"
    ).encode()
    return data[: max(0, limit - len(note))].decode(errors="ignore").encode() + note


class AnswerBoard:
    def __init__(self, store: KVStore, keys: Keys) -> None:
        self.store = store
        self.keys = keys

    # -- stacks on request ----------------------------------------------------------------
    def request_stacks(self, r: int) -> int:
        """Post a stacks request in round ``r``; return its number (1, 2, ...)."""
        return self.store.add(self.keys.round(r, "stack_requests"), 1)

    def stack_requests(self, r: int) -> int:
        """How many stacks requests round ``r`` has had. A plain read, never a write (an
        ``add`` of 0 would be a write on etcd)."""
        data = self.store.get(self.keys.round(r, "stack_requests"))
        return 0 if data is None else int(data)

    def post_stacks(self, r: int, request: int, rank: int, text: str) -> None:
        """Node ``rank``'s answer to request ``request`` of round ``r`` (capped: ``cap_stacks``)."""
        self.store.set(self.keys.stacks(r, request, rank), cap_stacks(text))

    def collect_stacks(
        self, r: int, request: int, ranks: Sequence[int], timeout: float
    ) -> dict[int, str]:
        """Wait up to ``timeout`` until every node in ``ranks`` answered ``request``; return
        the answers there are by node rank, deleting each from the store once read."""
        keys = {rank: self.keys.stacks(r, request, rank) for rank in ranks}
        return {
            rank: data.decode(errors="replace")
            for rank, data in self._collect(keys, timeout).items()
        }

    # -- status on request ----------------------------------------------------------------
    def request_status(self, r: int) -> int:
        """Post a status request in round ``r``; return its number (1, 2, ...)."""
        return self.store.add(self.keys.round(r, "status_requests"), 1)

    def status_requests(self, r: int) -> int:
        """How many status requests round ``r`` has had (a plain read, as ``stack_requests``)."""
        data = self.store.get(self.keys.round(r, "status_requests"))
        return 0 if data is None else int(data)

    def post_status(self, r: int, request: int, rank: int, data: bytes) -> None:
        """Node ``rank``'s answer to status request ``request`` of round ``r``."""
        self.store.set(self.keys.status(r, request, rank), data)

    def collect_status(
        self, r: int, request: int, ranks: Sequence[int], timeout: float
    ) -> dict[int, bytes]:
        """As ``collect_stacks``, for status answers."""
        return self._collect({rank: self.keys.status(r, request, rank) for rank in ranks}, timeout)

    # -- the node check -------------------------------------------------------------------
    def post_check(self, r: int, phase: str, rank: int, data: bytes) -> None:
        """Node ``rank``'s node-check record of ``phase`` in round ``r``."""
        self.store.set(self.keys.check(r, phase, rank), data)

    def read_check(
        self, r: int, phase: str, ranks: Sequence[int], timeout: float
    ) -> dict[int, bytes]:
        """The records of ``phase`` there are within ``timeout``; kept (every node reads
        them; the sweep deletes them with the round)."""
        return self._gather({rank: self.keys.check(r, phase, rank) for rank in ranks}, timeout)

    def _collect(self, keys: dict[int, str], timeout: float) -> dict[int, bytes]:
        """``_gather``, each answer deleted from the store once read."""
        found = self._gather(keys, timeout)
        for rank in found:
            self.store.delete(keys[rank])
        return found

    def _gather(self, keys: dict[int, str], timeout: float) -> dict[int, bytes]:
        """Wait up to ``timeout`` for every key, then the values there are by node rank."""
        self.store.wait(list(keys.values()), timeout)
        found = {}
        for rank, key in keys.items():
            data = self.store.get(key)
            if data is not None:
                found[rank] = data
        return found
