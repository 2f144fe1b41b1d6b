"""The ring watch of a round: each node judges the next one (rank + 1 mod n), ``liveness``'s
thread once per heartbeat interval (on a store with leases on every pass: below).

A node judged lost is settled as such in the round's store (``Board.settle``: one watcher
wins) and told to the whole job (``lost.Untold``). While the next node looks quiet or lost
the watch judges the ones after it too, so a run of dead nodes is found together and the
ring stays covered: O(1) reads per node per interval, not O(n).

A node whose heartbeat says it left (``LEFT``) is passed over once its place in the round is
settled (it left this round, or rejoined the next). Until then the ``LEFT`` may be from an
earlier round: a node stopped while it joined this one, after the round closed with it, has
no other heartbeat to show (it tells the round the job stopped: ``stopping``; should that
fail, or the node die between its writes, nobody else would). So a ``LEFT`` without a
settled place is a silence: lost after ``heartbeat_timeout``, as stopped beats are.

On a store with leases (etcd) a node is lost when etcd deletes its leased key, and reading
the key is the whole judgment (no counter to time), so the ring is judged on every pass of
the thread (``glance``: a quarter interval apart), its key read with the next event in one
request. Judged once per heartbeat interval, a frozen or cut-off node was found up to that
interval (0.5 s at the soak's pace) after etcd revoked its lease (issue 41). The verdict is
the same read as before, only sooner: a node is never judged lost while its key is there.
"""

from __future__ import annotations

import logging

from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.lost import Untold
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.dynamic.pulse import UNREAD, Pulse, Verdict
from phalanx.rendezvous.stores.base import LeasedStore

log = logging.getLogger("phalanx")


class RingWatch:
    """The thread's own state (``follow`` only starts it afresh): the nodes it judged lost
    in the followed round, and those it settled as lost but has not told yet."""

    def __init__(self, board: Board, pulse: Pulse, patience: float) -> None:
        """``patience``: how long a ``LEFT`` with no settled place counts as alive
        (``heartbeat_timeout``)."""
        self._b = board
        self._pulse = pulse
        self._patience = patience
        self._declared: set[str] = set()
        # Node id -> when its LEFT was first read with its place unsettled (None: settled).
        self._left: dict[str, float | None] = {}
        self._untold: list[Untold] = []  # settled as lost, not yet told
        self.glances = isinstance(board.store, LeasedStore)  # (see the module's docstring)
        self.told = 0  # how many losses this watch has told (the caller reads what it posted)

    def follow(self) -> None:
        """A new round: nobody in it is judged yet."""
        self._declared = set()
        self._left = {}

    def ahead(self, members: Membership, rank: int) -> str | None:
        """The heartbeat key ``watch`` reads first (None: nobody to judge), for the caller
        to read with its own reads in one round trip."""
        for step in range(1, members.count):
            node_id = members.node_ids[(rank + step) % members.count]
            if node_id not in self._declared:
                return self._b.keys.heartbeat(node_id)
        return None

    def watch(
        self,
        members: Membership,
        rank: int,
        now: float,
        read: dict[str, bytes | None] | None = None,
    ) -> None:
        """Judge the nodes after ``rank`` in the ring, up to the first one alive (``read``:
        heartbeat keys read already, by key)."""
        for step in range(1, members.count):
            other = (rank + step) % members.count
            node_id = members.node_ids[other]
            if node_id in self._declared:
                continue
            key = self._b.keys.heartbeat(node_id)
            verdict, why = self._pulse.judge(node_id, now, (read or {}).pop(key, UNREAD))
            if verdict is Verdict.LEFT:
                verdict, why = self._left_how(members, other, now)
            if verdict is Verdict.LOST:
                self._declare_lost(members, other, why)
            elif verdict is Verdict.ALIVE:
                return  # it watches the rest of the ring

    def glance(
        self, members: Membership, rank: int, now: float, reads: list[str]
    ) -> list[bytes | None]:
        """A pass between heartbeat passes, on a store with leases: read ``reads`` and the
        key ``watch`` judges first in one round trip, judge the ring by it, and return the
        values of ``reads``. A lapsed lease is then found within a pass of etcd deleting
        the key, not at the next heartbeat interval (see the module's docstring)."""
        ahead = self.ahead(members, rank)
        values = self._b.get_many([*reads, *([ahead] if ahead else [])])
        if ahead:
            self.watch(members, rank, now, {ahead: values.pop()})
        return values

    def _left_how(self, members: Membership, rank: int, now: float) -> tuple[Verdict, str]:
        """Member ``rank``'s ``LEFT``, judged by its place in the round (one read until it is
        found settled, then none)."""
        node_id = members.node_ids[rank]
        since = self._left.setdefault(node_id, now)
        if since is None:
            return Verdict.LEFT, ""
        if self._b.store.get(self._b.keys.fate(members.round, rank)) is not None:
            self._left[node_id] = None
            return Verdict.LEFT, ""
        if now - since < self._patience:
            return Verdict.QUIET, ""
        return Verdict.LOST, (
            f"its heartbeat says it left, but its place in round {members.round} is still "
            f"unsettled after {now - since:.0f} s (it went while it joined the round)"
        )

    def _declare_lost(self, members: Membership, rank: int, why: str) -> None:
        self._declared.add(members.node_ids[rank])
        if not self._b.settle(members.round, rank, members.count, "lost"):
            return  # it had rejoined or left, or another watcher was first
        self._untold.append(Untold(members, rank, why))
        self.tell_untold(members)

    def tell_untold(self, members: Membership) -> None:
        """Tell the round of the members this node settled as lost. Its place is settled,
        so no other watcher will: a post that fails (``StoreUnavailable``, raised) is kept
        and finished on a later tick, or the others would wait in a collective with the
        lost node's ranks until their transport gave up. Dropped once the round is left."""
        self._untold = [u for u in self._untold if u.membership is members]
        while self._untold:
            log.warning("rendezvous: %s", self._untold[0].tell(self._b))
            self._untold.pop(0)
            self.told += 1
