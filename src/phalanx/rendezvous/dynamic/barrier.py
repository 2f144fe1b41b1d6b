"""The exit barrier of one node's multi-node rendezvous (``handler``): after this node's
workers finished, wait until every member of the round has too, or the job failed
elsewhere, or the store was lost, or the time is up. Asked once; later calls get its answer."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from phalanx.rendezvous.api import EventKind, JobEvent
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.roundend import ENDS_ROUND
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import StoreUnavailable

log = logging.getLogger("phalanx")


class ExitBarrier:
    def __init__(
        self, board: Board, settings: RendezvousSettings, poll: Callable[[], JobEvent | None]
    ) -> None:
        """``poll``: the handler's (a peer's event, or the store's loss, ends the wait)."""
        self._board = board
        self._settings = settings
        self._poll = poll
        self._answer: tuple[bool, JobEvent | None] | None = None

    def once(
        self, membership: Membership | None, interrupted: Callable[[], bool] = lambda: False
    ) -> tuple[bool, JobEvent | None]:
        """``wait`` for ``exit_barrier_timeout``, once: later calls get its answer."""
        if self._answer is None:
            timeout = self._settings.exit_barrier_timeout
            self._answer = self.wait(membership, timeout, interrupted)
            all_done, event = self._answer
            if event is not None and event.kind is EventKind.STORE_LOST:
                log.warning("rendezvous: leaving before every node finished: %s", event.detail)
            elif not all_done and event is None and not interrupted():
                log.warning(
                    "rendezvous: not every node finished within exit_barrier_timeout=%gs; "
                    "leaving anyway",
                    timeout,
                )
        return self._answer

    def wait(
        self,
        membership: Membership | None,
        timeout: float,
        interrupted: Callable[[], bool] = lambda: False,
    ) -> tuple[bool, JobEvent | None]:
        """(all done, the event that ended the wait early: None on success, on the timeout,
        or once ``interrupted()``, which is asked at every event check)."""
        if membership is None:
            return True, None
        r = membership.round
        key = self._board.keys.round(r, "all_ok")
        deadline = time.monotonic() + timeout
        try:
            while not self._board.all_ok(r):
                if interrupted():
                    return False, None
                event = self._poll()
                if event is not None and event.kind in ENDS_ROUND:  # not a preemption: peers finish
                    return False, event
                left = deadline - time.monotonic()
                if left <= 0:
                    return False, None
                self._board.store.wait([key], min(left, self._settings.event_interval))
        except StoreUnavailable as exc:
            return False, JobEvent(EventKind.STORE_LOST, detail=str(exc))
        return True, None
