"""Requests asked on one node and answered by every node of the round, through the store:
``phalanx stacks`` and ``phalanx status`` (``StackExchange``, ``StatusExchange``); and the
node check's records, which every node posts and reads (``CheckRecords``).

One pattern for both: the asker bumps the round's request counter; every node learns of it
from its heartbeat thread (one plain read per beat, no write) and posts its answer under the
request's number; the asker collects what came within its timeout. With the store lost, a
request is an error, an answer is skipped (the asker names the node as not answering) and a
gather returns nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from phalanx.config import shown_run_id
from phalanx.errors import RendezvousError
from phalanx.rendezvous.api import JobEvent
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.roundend import ENDS_CHECK
from phalanx.rendezvous.stores.base import StoreUnavailable

log = logging.getLogger("phalanx")

Answer = TypeVar("Answer")

LOST_CHECK = 1.0  # s: how often a node check's wait looks whether the store counts as lost


@dataclass(frozen=True)
class Channel(Generic[Answer]):
    """One kind of request: the board's and the heartbeat thread's calls for it."""

    what: str  # "stacks", "status": for messages
    ask: Callable[[int], int]  # round -> the new request's number
    post: Callable[[int, int, int, Answer], None]  # round, request, node rank, answer
    collect: Callable[[int, int, Sequence[int], float], dict[int, Answer]]
    seen: Callable[[], int]  # the newest request the heartbeat thread has read
    saw: Callable[[int], None]  # this node's own request, known at once


class RoundExchange(Generic[Answer]):
    def __init__(
        self,
        channel: Channel[Answer],
        store_problem: Callable[[], str | None],
        current: Callable[[], tuple[Membership, int]],
        run_id: str,
    ) -> None:
        self._channel = channel
        self._store_problem = store_problem
        self._current = current
        self._run_id = run_id

    def request(self) -> int:
        membership, _ = self._current()
        problem = self._store_problem()
        if problem is not None:
            raise RendezvousError(problem)
        try:
            request = self._channel.ask(membership.round)
        except StoreUnavailable as exc:
            raise RendezvousError(f"rendezvous {shown_run_id(self._run_id)}: {exc}") from None
        self._channel.saw(request)
        return request

    def requests(self) -> int:
        return self._channel.seen()

    def post(self, request: int, answer: Answer) -> None:
        membership, rank = self._current()
        if self._store_problem() is not None:
            return  # the requester will name this node as not answering
        try:
            self._channel.post(membership.round, request, rank, answer)
        except StoreUnavailable as exc:
            log.warning("rendezvous: could not post this node's %s: %s", self._channel.what, exc)

    def gather(
        self, round: int, request: int, node_ranks: Sequence[int], timeout: float
    ) -> dict[int, Answer]:
        if self._store_problem() is not None:
            return {}
        try:
            return self._channel.collect(round, request, node_ranks, timeout)
        except StoreUnavailable as exc:
            log.warning(
                "rendezvous: could not read the other nodes' %s: %s", self._channel.what, exc
            )
            return {}


class StackRequests(RoundExchange[str]):
    """``StackExchange`` (``phalanx stacks``) on the round's keys: the handler gives it out."""

    request_stacks = RoundExchange.request
    stack_requests = RoundExchange.requests
    post_stacks = RoundExchange.post
    gather_stacks = RoundExchange.gather


class StatusRequests(RoundExchange[bytes]):
    """``StatusExchange`` (``phalanx status``) on the round's keys, as ``StackRequests``."""

    request_status = RoundExchange.request
    status_requests = RoundExchange.requests
    post_status = RoundExchange.post
    gather_status = RoundExchange.gather

    def __init__(
        self,
        channel: Channel[bytes],
        store_problem: Callable[[], str | None],
        current: Callable[[], tuple[Membership, int]],
        run_id: str,
        spares: Callable[[], int],
    ) -> None:
        super().__init__(channel, store_problem, current, run_id)
        self.spares = spares  # the heartbeat thread's last count of the next round's queue


class CheckRecords:
    """``CheckExchange`` on the round's keys (``check/<phase>/<rank>``)."""

    def __init__(
        self,
        board: Board,
        store_problem: Callable[[], str | None],
        current: Callable[[], tuple[Membership, int]],
        pending: Callable[[], JobEvent | None],
    ) -> None:
        self._board = board
        self._store_problem = store_problem
        self._current = current
        self._pending = pending  # the round's first event not yet taken by the agent

    def post_check(self, phase: str, data: bytes) -> None:
        membership, rank = self._current()
        self._raise_if_lost()
        try:
            self._board.answers.post_check(membership.round, phase, rank, data)
        except StoreUnavailable as exc:
            log.warning("rendezvous: could not post this node's check (%s): %s", phase, exc)

    def gather_check(
        self, phase: str, node_ranks: Sequence[int], timeout: float
    ) -> dict[int, bytes]:
        membership, _ = self._current()
        deadline = time.monotonic() + timeout
        while True:
            # In slices: the heartbeat thread may find the store lost (or junk in it) while
            # this waits for a node that will never post; the agent must hear it then.
            self._raise_if_lost()
            left = deadline - time.monotonic()
            try:
                found = self._board.answers.read_check(
                    membership.round, phase, node_ranks, max(0.0, min(left, LOST_CHECK))
                )
            except StoreUnavailable as exc:
                log.warning("rendezvous: could not read the other nodes' checks (%s): %s", phase, exc)  # fmt: skip
                return {}
            if len(found) == len(node_ranks) or left <= LOST_CHECK:
                return found

    def _raise_if_lost(self) -> None:
        """The store lost, or the round already over: a member lost, a peer's workers failed,
        the job stopped or preempted (``roundend.ENDS_CHECK``). A check waits up to a minute for a member's records; one that died
        or was fenced while it checked never posts them, and the others would wait that out
        (and the round's judgement with them) before they acted on what their watch heard."""
        problem = self._store_problem()
        if problem is not None:
            raise RendezvousError(problem)
        event = self._pending()
        if event is not None and event.kind in ENDS_CHECK:
            raise RendezvousError(event.detail or f"the round ended ({event.kind.value})")
