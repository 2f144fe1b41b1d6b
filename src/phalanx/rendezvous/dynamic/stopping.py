"""What one node of a multi-node rendezvous tells the job as it stops (``handler``): it gave
up while joining, it stops the job for good (``JOB_STOPPED`` to every peer), it got a
preemption signal (the job's notice, ``PREEMPTED`` to every peer). The handler checks first
that the store is there to tell; a store call that fails here is only logged."""

from __future__ import annotations

import logging

from phalanx.errors import signal_name
from phalanx.rendezvous.api import EventKind, JobEvent
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.stores.base import StoreUnavailable

log = logging.getLogger("phalanx")


def tell_left_while_joining(
    board: Board, hostname: str, addr: str, signum: int | None, preempted: bool
) -> None:
    """Gave up before any round formed (a signal while joining): no round can form as
    the others expect, so the job stops and every node waiting to join hears why."""
    try:
        board.stop(
            f"node {hostname} ({addr}) left while joining",
            None,
            signum=signum,
            preempted=preempted,
        )
    except StoreUnavailable as exc:
        log.warning("rendezvous: could not tell the other nodes this node left: %s", exc)


def tell_job_stopped(
    board: Board,
    membership: Membership,
    rank: int,
    hostname: str,
    signum: int | None,
    preempted: bool,
) -> None:
    """Stop the job for good: no new round forms, every peer sees ``JOB_STOPPED``."""
    try:
        how = f"was stopped by {signal_name(signum)}" if signum is not None else "gave up"
        stop = board.stop(
            f"node {rank} ({hostname}) {how}",
            rank,
            signum=signum,
            preempted=preempted,
        )
        if stop:
            detail = f"node {rank} ({hostname}) stopped the job"
            if signum is not None:
                detail = f"node {rank} ({hostname}) {how}: the job stops"
            failure: dict[str, object] = {} if signum is None else {"signal": signum}
            event = JobEvent(EventKind.JOB_STOPPED, rank, detail, failure)
            board.post_event(membership.round, event, about=board.node_id)
    except StoreUnavailable as exc:
        log.warning("rendezvous: could not tell the other nodes the job stopped: %s", exc)


def tell_preempted(
    board: Board, membership: Membership, rank: int, hostname: str, notice: dict[str, object]
) -> dict[str, object]:
    """Set the job's preemption notice of the round unless another node was first (then
    every other node sees ``PREEMPTED``); the job's notice, or ``notice`` when the store
    could not take it."""
    key = board.keys.round(membership.round, "preempted")
    try:
        job = board.put_first(key, notice)
        if job.get("by") == board.node_id:
            detail = f"node {rank} ({hostname}) got {notice.get('signal')}"
            event = JobEvent(EventKind.PREEMPTED, rank, detail, dict(job))
            board.post_event(membership.round, event, about=board.node_id)
    except StoreUnavailable as exc:
        log.warning("rendezvous: could not tell the other nodes of the preemption: %s", exc)
        return notice
    return job


def read_preemption(board: Board, round: int) -> dict[str, object] | None:
    """The job's preemption notice of ``round`` (None: none, or the store could not say)."""
    try:
        return board.get_json(board.keys.round(round, "preempted"))
    except StoreUnavailable as exc:
        log.warning("rendezvous: could not read whether the job was preempted: %s", exc)
        return None
