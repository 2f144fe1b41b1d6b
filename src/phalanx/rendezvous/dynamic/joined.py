"""A round this node joined (``next_round``'s ``Round``; the handler's per-round half): its
facts, its failures told to the job, the restart claimed, the round judged, the preemption
told and read, the exit barrier, the exchanges. One is made when a round forms, for that
round and this node's rank in it, so none of them asks whether a round has formed. Store
trouble: ``claim_restart`` and ``judge_round`` raise ``RendezvousError``; telling a failure
or a preemption only logs it (the node stops anyway).

The calls go through the node's wiring as it is at the time (``Wires``): after a ``rejoin``
the last round's calls (the restart claimed) go over the new member's board and heartbeats.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from phalanx.config import shown_run_id
from phalanx.errors import RendezvousError
from phalanx.rendezvous.api import (
    EventKind,
    Exchanges,
    JobEvent,
    RendezvousResult,
    RoundVerdict,
    Signature,
    restarts_left,
)
from phalanx.rendezvous.dynamic.barrier import ExitBarrier
from phalanx.rendezvous.dynamic.board import LEFT, Board
from phalanx.rendezvous.dynamic.exchange import (
    Channel,
    CheckRecords,
    StackRequests,
    StatusRequests,
)
from phalanx.rendezvous.dynamic.health import call_bound
from phalanx.rendezvous.dynamic.judge import judge
from phalanx.rendezvous.dynamic.liveness import Liveness
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.dynamic.stopping import (
    read_preemption,
    tell_job_stopped,
    tell_preempted,
)
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import StoreUnavailable

log = logging.getLogger("phalanx")


@dataclass(frozen=True)
class Wires:
    """One member's wiring to the store (``handler``'s, renewed by a ``rejoin``)."""

    board: Board
    liveness: Liveness
    barrier: ExitBarrier  # ``await_peers``' answer, kept


class JoinedRound:
    """Round ``membership`` of run ``run_id`` as node rank ``rank`` (on ``hostname``), the
    workers' store at ``master``."""

    def __init__(
        self,
        run_id: str,
        membership: Membership,
        rank: int,
        master: tuple[str, int],
        wires: Callable[[], Wires],
        settings: RendezvousSettings,
        hostname: str,
        before: RoundVerdict | None = None,
    ) -> None:
        self.result = RendezvousResult(
            run_id=run_id,
            round=membership.round,
            restart_count=membership.restart_count,
            node_rank=rank,
            nodes=membership.nodes,
            master_addr=master[0],
            master_port=master[1],
            fingerprints=membership.fingerprints,
            node_ids=membership.node_ids,
            abandoned=membership.abandoned,
        )
        self._wires = wires
        self.settings = settings
        self.membership = membership
        self.rank = rank
        self.hostname = hostname
        self.before = before  # the job's verdict on the round before (re-published on failover)
        self.verdict: RoundVerdict | None = None  # the job's verdict on this one, once judged

    @property
    def board(self) -> Board:
        return self._wires().board

    @property
    def liveness(self) -> Liveness:
        return self._wires().liveness

    def _unreachable(self, exc: StoreUnavailable) -> RendezvousError:
        return RendezvousError(f"rendezvous {shown_run_id(self.board.keys.run_id)}: {exc}")

    def report_failure(self, failure: dict[str, object]) -> int | None:
        if self.liveness.fenced():
            return None  # nobody to tell: a store call would only wait out its timeout
        membership, rank, hostname = self.membership, self.rank, self.hostname
        record = {"node_rank": rank, "hostname": hostname, "round": membership.round}
        record.update(failure)
        detail = f"node {rank} ({hostname}) reported a worker failure"
        if failure.get("peer_error"):  # its cause may be in the store already: told first
            self.liveness.look.now(call_bound(self.settings))  # (``look``)
        seq = None
        try:
            seq = self.board.add_failure(record)
            event = JobEvent(EventKind.PEER_FAILED, rank, detail, dict(failure))
            self.board.post_event(membership.round, event, about=self.board.node_id)
        except StoreUnavailable as exc:
            log.warning("rendezvous: could not tell the other nodes about the failure: %s", exc)
        return seq

    def report_preemption(self, notice: dict[str, object]) -> dict[str, object]:
        if self.liveness.store_problem() is not None:
            return notice  # nobody to tell; this node still stops within its own grace
        return tell_preempted(self.board, self.membership, self.rank, self.hostname, notice)

    def preemption(self) -> dict[str, object] | None:
        if self.liveness.store_problem() is not None:
            return None
        return read_preemption(self.board, self.membership.round)

    def claim_restart(self, max_restarts: int) -> bool:
        if self.liveness.fenced():  # the others are forming the next round without us
            raise RendezvousError(self.liveness.store_problem() or "fenced")
        membership = self.membership
        r = membership.round
        try:
            within = restarts_left(membership.restart_count, max_restarts) > 0
            finished = within and self.board.any_ok(r)
            restart = self.board.claim(r, within and not finished)
        except StoreUnavailable as exc:
            raise self._unreachable(exc) from None
        if finished and not restart:
            log.warning(
                "rendezvous: not restarting: a node of this round had already finished its "
                "workers, and finished workers are not run again"
            )
        return restart

    def judge_round(self, progressed: bool, signature: Signature) -> RoundVerdict:
        problem = self.liveness.store_problem()
        if problem is not None:
            raise RendezvousError(problem)
        try:
            self.verdict = judge(self.board, self.membership, progressed, signature, self.settings)
            return self.verdict
        except StoreUnavailable as exc:
            raise self._unreachable(exc) from None

    def leave(self, ok: bool) -> bool:
        """This node leaves the round on purpose (``report_done``): its heartbeat says so,
        its place is settled as left, and ``ok`` (its workers finished) is counted. False
        when the store could not take it (only logged)."""
        board, membership = self.board, self.membership
        try:
            board.store.set(board.keys.heartbeat(board.node_id), LEFT)
            board.settle(membership.round, self.rank, membership.count, "left")
            if ok:
                board.mark_ok(membership.round, membership.count)
        except StoreUnavailable as exc:
            log.warning("rendezvous: could not report this node as done: %s", exc)
            return False
        return True

    def stop_job(self, signum: int | None, preempted: bool) -> None:
        """This node gives up for good: every peer sees ``JOB_STOPPED`` (with ``signum``,
        the signal that stopped it, if one did)."""
        if self.liveness.store_problem() is not None:
            return
        tell_job_stopped(
            self.board, self.membership.round, self.rank, self.hostname, signum, preempted
        )

    def await_peers(self, interrupted: Callable[[], bool] = lambda: False) -> JobEvent | None:
        _, event = self._wires().barrier.once(self.membership, interrupted)
        return None if event is None or event.kind is EventKind.STORE_LOST else event

    def exchanges(self) -> Exchanges:
        """Built over the wiring of now, for this round and rank (they keep no state)."""
        board, liveness = self.board, self.liveness
        answers, problem, run_id = board.answers, liveness.store_problem, board.keys.run_id
        here = (self.membership, self.rank)
        stacks = Channel[str]("stacks", answers.request_stacks, answers.post_stacks,
                              answers.collect_stacks, liveness.stack_requests,
                              liveness.saw_stack_request)  # fmt: skip
        status = Channel[bytes]("status", answers.request_status, answers.post_status,
                                answers.collect_status, liveness.status_requests,
                                liveness.saw_status_request)  # fmt: skip
        return Exchanges(
            StackRequests(stacks, problem, lambda: here, run_id),
            StatusRequests(status, problem, lambda: here, run_id, liveness.spares),
            CheckRecords(board, problem, lambda: here, liveness.pending_event),
        )
