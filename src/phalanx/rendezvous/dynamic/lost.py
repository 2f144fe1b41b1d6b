"""A member gone from a running round, told to the whole job (``liveness``, ``handler``).

Whoever notices first -- the node watching it (its heartbeat ran out, its lease lapsed,
its guardian said it died) or the node itself, coming back as a new member after it lost
the store -- posts two things in the round's name, in this order:

1. a failure record ``{"kind": "node_lost", ...}`` in the job's failure log, with the node's
   rank, host, address and node id: the store's sequence number places it among the
   round's failures, so the report names the lost node ahead of the ranks that failed only
   because it went (``peer_error``: "Connection closed by peer");
2. ``NODE_LOST`` in the round's event log (its ``failure`` the same record), which every
   other member's watch thread reads at once: they stop their workers and re-form, instead
   of waiting in a collective with a peer that is gone.

The record is read back as a worker exit of kind ``node_lost`` by the report
(``phalanx.report.job.record_exits``).
"""

from __future__ import annotations

import logging
import time

from phalanx.rendezvous.api import EventKind, JobEvent
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.health import call_bound
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import StoreUnavailable, TwinnedStore

log = logging.getLogger("phalanx")

LOST_KIND = "node_lost"


def lost_record(
    membership: Membership, rank: int, why: str, since: float | None = None
) -> dict[str, object]:
    """The failure record of member ``rank`` of ``membership``, gone because ``why``;
    ``since``: the wall-clock time it went, where known (else now: when it was found)."""
    node = membership.nodes[rank]
    node_id = membership.node_ids[rank]
    first = sum(n.local_world_size for n in membership.nodes if n.node_rank < node.node_rank)
    return {
        "kind": LOST_KIND,
        "round": membership.round,
        "node_rank": rank,
        "hostname": node.hostname,
        "addr": node.addr,
        "node_id": node_id,
        "first_rank": first,
        "local_world_size": node.local_world_size,
        "reason": f"node {rank} ({node.hostname}, {node.addr}, node id {node_id}) {why}",
        "time": time.time() if since is None else since,
    }


class Untold:
    """Member ``rank`` of ``membership`` found gone (``why``, ``since``: see
    ``lost_record``), to be told to its round: its record, then ``NODE_LOST``. ``tell``
    may fail part way (a store call timed out); called again, it posts only what is left,
    so a watcher whose post failed tells the round on its next tick, and once."""

    def __init__(
        self, membership: Membership, rank: int, why: str, since: float | None = None
    ) -> None:
        self.membership, self.rank = membership, rank
        self.record = lost_record(membership, rank, why, since)
        self._seq: int | None = None  # the record's sequence number, once it is posted

    def tell(self, board: Board) -> str:
        """Post what is not posted yet; returns the event's detail. Store errors propagate
        (``StoreUnavailable``): call again to finish."""
        if self._seq is None:
            self._seq = board.add_failure(self.record)
        detail = str(self.record["reason"])
        event = JobEvent(EventKind.NODE_LOST, self.rank, detail, {**self.record, "seq": self._seq})
        about = self.membership.node_ids[self.rank]
        board.post_event(self.membership.round, event, about=about)
        return detail


def tell_lost(
    board: Board,
    membership: Membership,
    rank: int,
    why: str,
    since: float | None = None,
) -> str:
    """Post member ``rank``'s record (``since``: see ``lost_record``) and ``NODE_LOST``
    about it in its round; returns the event's detail. Store errors propagate
    (``StoreUnavailable``)."""
    return Untold(membership, rank, why, since).tell(board)


def tell_rejoining(
    board: Board, membership: Membership, rank: int, why: str | None, since: float
) -> None:
    """This node (member ``rank`` of ``membership``) lost the store (``why``; the store's
    last answer at wall-clock ``since``: the failure's time in the others' recovery figures)
    and is about to wait in the next round as a new member: tell the round it left, before
    it waits there. Without this its watcher would find its old place settled as rejoined
    and say nothing, and the others would wait in a collective with its dead ranks until a
    transport timeout (minutes with Gloo, up to half an hour with NCCL). A store error here
    is only logged: the store that answered a moment ago failed again, and the restart
    claim that comes next meets it too (and ends this node's part).

    Its old place is settled as rejoined first, and only that settles who tells: a node
    gone longer than ``heartbeat_timeout`` was found lost by its watcher, who told the
    round already (its record and ``NODE_LOST``); a second of each would name it twice."""
    how = f"lost the rendezvous store ({why or 'fenced'}) and rejoins as a new member"
    try:
        if not board.settle(membership.round, rank, membership.count, "rejoined"):
            return  # found lost (and told) by its watcher while it was away
        tell_lost(board, membership, rank, how, since)
    except StoreUnavailable as exc:
        log.warning("rendezvous: could not tell the other nodes this node left: %s", exc)


def store_answers(board: Board, settings: RendezvousSettings) -> bool:
    """Wait until the store answers again (one bounded call each ``heartbeat_interval``),
    at most ``close_timeout``: a store that is gone for good ends the job soon. False when
    it stayed out of reach.

    The calls go out on a handle of their own, bounded as the heartbeat's (``call_bound``),
    where the store can open one: on the agent's own handle a store host that is frozen, or
    whose packets are dropped, held the first call for ``read_timeout`` (60 s by default),
    past ``close_timeout`` (a fenced node so ended 30 s after its fence, not 10)."""
    twin = None
    if isinstance(board.store, TwinnedStore):
        twin = board.store.twin(call_bound(settings))
        board = Board(twin, board.keys, board.node_id)
    until = time.monotonic() + settings.close_timeout
    try:
        while True:
            try:
                board.latest_round()
                return True
            except StoreUnavailable:
                if time.monotonic() >= until:
                    return False
                time.sleep(settings.heartbeat_interval)
    finally:
        if twin is not None:
            twin.close()  # its own connections only, never the server
