"""The ring watch of a round: each node judges the next one (rank + 1 mod n), ``liveness``'s
thread once per heartbeat interval.

A node judged lost is settled as such in the round's store (``Board.settle``: one watcher
wins) and told to the whole job (``lost.Untold``). While the next node looks quiet or lost
the watch judges the ones after it too, so a run of dead nodes is found together and the
ring stays covered: O(1) reads per node per interval, not O(n).
"""

from __future__ import annotations

import logging

from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.lost import Untold
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.dynamic.pulse import Pulse, Verdict

log = logging.getLogger("phalanx")


class RingWatch:
    """The thread's own state (``follow`` only starts it afresh): the nodes it judged lost
    in the followed round, and those it settled as lost but has not told yet."""

    def __init__(self, board: Board, pulse: Pulse) -> None:
        self._b = board
        self._pulse = pulse
        self._declared: set[str] = set()
        self._untold: list[Untold] = []  # settled as lost, not yet told

    def follow(self) -> None:
        """A new round: nobody in it is judged yet."""
        self._declared = set()

    def watch(self, members: Membership, rank: int, now: float) -> None:
        """Judge the nodes after ``rank`` in the ring, up to the first one alive."""
        for step in range(1, members.count):
            other = (rank + step) % members.count
            node_id = members.node_ids[other]
            if node_id in self._declared:
                continue
            verdict, why = self._pulse.judge(node_id, now)
            if verdict is Verdict.LOST:
                self._declare_lost(members, other, why)
            elif verdict is Verdict.ALIVE:
                return  # it watches the rest of the ring

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
