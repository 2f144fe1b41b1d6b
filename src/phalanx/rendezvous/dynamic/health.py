"""Whether a multi-node handler's store counts as lost (``liveness.Liveness`` asks).

On a store that can open a second handle on itself (``TwinnedStore``: the agent store)
the heartbeat and watch threads use handles of their own whose calls are bounded by
``call_bound`` rather than ``read_timeout``: a call caught in TCP's retransmission backoff
on a lossy link is given up and the next goes out on a fresh connection. Such a timeout is
no error: the store counts as lost only when nothing it was asked (a beat included) got an
answer for ``heartbeat_timeout``, or calls failed with errors for two heartbeats in a row.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import KVStore, StoreTimedOut, StoreUnavailable, TwinnedStore


def call_bound(settings: RendezvousSettings) -> float:
    """Seconds one call of the heartbeat or watch thread may take: a quarter of
    ``heartbeat_timeout`` (at least a heartbeat interval, at most ``read_timeout``), so a
    stuck call is given up several times over before the store would count as silent."""
    bound = max(settings.heartbeat_interval, settings.heartbeat_timeout / 4)
    return min(settings.read_timeout, bound)


class StoreHealth:
    """What the threads heard from the store: the last answer, errors since when, and
    whether this node was expelled (its lease expired, or the store holds junk)."""

    def __init__(self, settings: RendezvousSettings, clock: Callable[[], float]) -> None:
        self._s = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._expelled: str | None = None  # why this node no longer counts as a member
        self._last_ok = clock()
        self._failing_since: float | None = None
        self._last_error = ""

    def answered(self) -> None:
        with self._lock:
            self._last_ok = self._clock()

    def recovered(self) -> None:
        """A whole pass of the watch thread got its answers."""
        with self._lock:
            self._last_ok = self._clock()
            self._failing_since = None

    def last_ok(self) -> float:
        with self._lock:
            return self._last_ok

    def failed(self, exc: StoreUnavailable) -> None:
        with self._lock:
            self._last_error = str(exc)
            if self._failing_since is None and not isinstance(exc, StoreTimedOut):
                self._failing_since = self._clock()

    def timed_out(self, exc: StoreTimedOut) -> None:
        with self._lock:
            self._last_error = str(exc)

    def expel(self, why: str) -> None:
        """The first reason this node no longer counts as a member (later ones are kept out)."""
        with self._lock:
            if self._expelled is None:
                self._expelled = why

    def malformed(self, why: str) -> None:
        """The store holds junk where this node reads: final, and the newest reason."""
        with self._lock:
            self._expelled = why

    def problem(self, fenced: str | None) -> str | None:
        """Why the store counts as lost, or None: errors for two heartbeats in a row, no
        answer at all (a call stuck on a vanished host) for ``heartbeat_timeout``, this
        node's lease expired (the others count it as lost), or ``fenced``: it fenced itself
        (then what is known of the store too)."""
        now = self._clock()
        with self._lock:
            failing, last_ok, error = self._failing_since, self._last_ok, self._last_error
            if self._expelled is not None:
                return self._expelled if fenced is None else f"{fenced}; {self._expelled}"
        if fenced is not None:  # the store's side, as far as it is known yet
            if failing is not None:
                return f"{fenced}; the rendezvous store is unreachable: {error}"
            if now - last_ok > self._s.heartbeat_interval:
                return f"{fenced}; the rendezvous store has not answered for {now - last_ok:.0f} s"
            return fenced
        if failing is not None and now - failing >= 2 * self._s.heartbeat_interval:
            return f"the rendezvous store is unreachable: {error}"
        if now - last_ok > self._s.heartbeat_timeout:
            return f"the rendezvous store has not answered for {now - last_ok:.0f} s"
        return None


def twinned(board: Board, bound: float) -> tuple[list[KVStore], Board, KVStore | None]:
    """(the twins, the board the watch thread reads, the heartbeat's store): on a store that
    can open handles on itself, one for each thread, their calls bounded by ``bound``."""
    if not isinstance(board.store, TwinnedStore):
        return [], board, None
    watch_store, beat_store = board.store.twin(bound), board.store.twin(bound)
    return [watch_store, beat_store], Board(watch_store, board.keys, board.node_id), beat_store
