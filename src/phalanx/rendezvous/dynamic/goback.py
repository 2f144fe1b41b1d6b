"""A member cut off for a moment goes back to the job's store (design.md, "When the store's
host is lost").

A member that loses the store and reaches no other candidate serves a store of its own (the
walk ends at itself). No quorum of the last round's members reaches it, and it used to wait
there for their keepalive and the last call (40 to 50 s in the c10d soak) before it stopped
as cut off (exit 79) -- though its own link was down only seconds (a flap, a short cut) and
the job's store, whose host was never lost, answered again long before; the job meanwhile ran
without a spare. Now, while a restart round waits on a store it serves and no quorum reached,
it tries the store it lost once a second (one bounded try; that same store, by its id). It
goes back when that store answers and the job went on there (the restart round formed on it:
a quorum of the members stayed), or when it has waited alone for the walk's patience (twice
``heartbeat_timeout``: no survivor is still on its way to it). Not merely because the store
answers: a store host frozen past ``heartbeat_timeout`` answers once resumed, while the
survivors are still reaching this node's store (gone back then, it left them cut off and the
job ended). It fails the round waiting on its own store (a compare-and-set: a round decided
there first keeps it there) and goes back as a member of the last round coming back
(``lost.tell_rejoining``): the job takes it again, or goes on without it and it waits as a
spare, as for any member whose store answered again.

No split brain: it leaves only a store no quorum reached (``majority.confirmed``), after
failing the round there, so no round forms on it and it counts on one live store only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from phalanx.rendezvous.dynamic.board import Board, Decision
from phalanx.rendezvous.dynamic.failover import Failover, Move
from phalanx.rendezvous.dynamic.follow import signposted
from phalanx.rendezvous.dynamic.majority import CUT_OFF, confirmed
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import KVStore

EVERY = 1.0  # seconds between two tries at the store it lost (each at most ``failover.TRY``)
LEFT = (
    f"{CUT_OFF}the node that served this store went back to the job's store, which answers "
    "again; no round forms here"
)


class StoreBack(Exception):
    """Out of the round's wait: the store this node lost answers again, or the job left word
    of where its store went (a newcomer); ``move``: there."""

    def __init__(self, move: Move) -> None:
        super().__init__()
        self.move = move


class GoBack:
    """This node's tries at the store it lost, while it waits alone on the one it serves."""

    def __init__(
        self,
        failover: Failover,
        settings: RendezvousSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._failover, self._clock = failover, clock
        # The walk's patience: by then every survivor that found the loss reached this store
        # (or never will), so no survivor is still on its way here when this node leaves.
        self._alone = 2 * settings.heartbeat_timeout
        self._next = 0.0
        self._since: tuple[KVStore, float] | None = None  # (the store, when it began to wait)

    def check(self, board: Board, t: int, newcomer: bool = False) -> None:
        """Called while round ``t`` waits on ``board``'s store: raise ``StoreBack``
        once this node serves that store after a failover, no quorum reached it, and the
        store it lost answers again and may be gone back to (``_went_on``, or this node waited
        alone long enough; round ``t`` here then failed). A ``newcomer`` (in no round yet)
        on a store of no failover: once the job left word there of the store it moved to
        (``follow.signposted``), the move there. Store errors propagate."""
        store, keys, epoch = board.store, board.keys, self._failover.epoch
        if newcomer and epoch == 0 and self._clock() >= self._next:
            self._next = self._clock() + EVERY
            if (there := signposted(board, self._failover)) is not None:
                raise StoreBack(there)
            return
        if not store.hosting or epoch == 0 or self._clock() < self._next:
            return
        if self._since is None or self._since[0] is not store:  # (a failover number repeats)
            self._since = (store, self._clock())
        alone = self._clock() - self._since[1] >= self._alone
        try:
            if confirmed(store, keys, epoch):
                return

            def leave(there: KVStore) -> bool:  # (a member may have come while it tried)
                if not (alone or _went_on(Board(there, keys, "goback"), t)):
                    return False
                if confirmed(store, keys, epoch):
                    return False
                return board.close(t, Decision(failure=LEFT)).failure == LEFT

            move = self._failover.back(leave)
        finally:
            self._next = self._clock() + EVERY
        if move is not None:
            raise StoreBack(move)


def _went_on(there: Board, t: int) -> bool:
    """Whether round ``t`` formed on the store this node lost: the members that stayed there
    were a quorum (at least half of round t-1's), so the job goes on there, and no
    successor's store can hold a strict majority of them. Not yet: the store answering
    alone says only that its host is back -- a store host frozen past ``heartbeat_timeout``
    answers too, after the others moved on (they may still be reaching this node's store)."""
    decision = there.decision(t)
    return decision is not None and not decision.failed
