"""What one node of a multi-node rendezvous tells the job as it stops (``handler``): it gave
up while joining, it stops the job for good (``JOB_STOPPED`` to every peer), it got a
preemption signal (the job's notice, ``PREEMPTED`` to every peer). The handler checks first
that the store is there to tell; a store call that fails here is only logged.

A node stopped while joining may already be a member: the round it joined closed with it
before ``next_round`` returned (``placed_in``). The other members may be running that round
by now, reading only its event log, and they judge this node by its heartbeat key, which
says ``left`` once it stops. So it leaves that round as a running member does (its place
settled as left, ``JOB_STOPPED`` in that round's log): told anywhere else, they would wait
for it for ever.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from phalanx.errors import signal_name
from phalanx.rendezvous.api import EventKind, JobEvent
from phalanx.rendezvous.dynamic.board import LEFT, Board
from phalanx.rendezvous.dynamic.members import Arrival, Membership, assign_ranks
from phalanx.rendezvous.dynamic.records import decode, parsed
from phalanx.rendezvous.stores.base import StoreUnavailable

log = logging.getLogger("phalanx")


@dataclass(frozen=True)
class Placed:
    """A round that closed with this node in it (node rank ``rank`` of ``count``) while the
    node was still joining it."""

    round: int
    rank: int
    count: int


def placed_in(board: Board, after: int) -> Placed | None:
    """The round after round ``after`` (-1: none) that closed with this node as a member, or
    None (also when the store could not say). A node joins the newest round or, when that
    one was full, the one before it: no older one is looked at. A few reads, once a job."""
    try:
        latest = board.latest_round()
        for r in range(latest, max(after, latest - 2), -1):
            decision = board.decision(r)
            if decision is None or decision.failed:
                continue
            rank = _rank_in(board, r, decision.count)
            if rank is not None:
                return Placed(r, rank, decision.count)
    except StoreUnavailable as exc:
        log.warning("rendezvous: could not read which round this node was joining: %s", exc)
    return None


def _rank_in(board: Board, r: int, count: int) -> int | None:
    """This node's rank in round ``r`` (closed with ``count`` arrivals): the membership's,
    or before it is written the one its arrivals make (``assign_ranks``, as slot 1 will);
    None when this node is not in it, or an arrival is still missing."""
    key = board.keys.round(r, "members")
    found = board.get_json(key)
    if found is not None:
        ids = () if "fail" in found else parsed(key, found, Membership.from_json).node_ids
        return ids.index(board.node_id) if board.node_id in ids else None
    keys = [board.keys.node(r, slot) for slot in range(1, count + 1)]
    values = board.get_many(keys)
    if any(value is None for value in values):
        return None
    arrivals = [
        parsed(k, decode(v, k), Arrival.from_json) for k, v in zip(keys, values, strict=True) if v
    ]
    ids = tuple(arrival.node_id for arrival in arrivals)
    if board.node_id not in ids:
        return None
    try:
        return assign_ranks(arrivals)[ids.index(board.node_id)]
    except ValueError:
        return None  # the round fails (bad fixed ranks): its members are told so


def tell_left_while_joining(
    board: Board,
    placed: Placed | None,
    hostname: str,
    addr: str,
    signum: int | None,
    preempted: bool,
) -> None:
    """Gave up while joining (a signal): the job stops. ``placed``: the round had closed
    with this node in it, so this node leaves it as its running members do (``LEFT``, its
    place settled as left) and they hear ``JOB_STOPPED`` there. None: no round can form as
    the others expect, and every node still joining hears why (``stopped``)."""
    try:
        if placed is None:
            reason = f"node {hostname} ({addr}) left while joining"
            board.stop(reason, None, signum=signum, preempted=preempted)
            return
        board.store.set(board.keys.heartbeat(board.node_id), LEFT)
        board.settle(placed.round, placed.rank, placed.count, "left")
    except StoreUnavailable as exc:
        log.warning("rendezvous: could not tell the other nodes this node left: %s", exc)
        return
    tell_job_stopped(board, placed.round, placed.rank, hostname, signum, preempted)


def tell_job_stopped(
    board: Board,
    r: int,
    rank: int,
    hostname: str,
    signum: int | None,
    preempted: bool,
) -> None:
    """Stop the job for good: no new round forms, every member of round ``r`` sees
    ``JOB_STOPPED``."""
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
            board.post_event(r, event, about=board.node_id)
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
