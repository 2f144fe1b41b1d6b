"""What a node waiting for round t reads on each wake while round t-1 runs: one round trip.

A node that waits outside the running round (a spare beyond MAX, a newcomer, a member that
lost its place: ``formation``) wakes every heartbeat interval, or at once when round t opens
(the wait watches its ``open`` key). On each wake it asks: is round t open, did the job stop,
how does round t-1 stand (its decision: is this node a spare; ``all_ok``: did it finish), is
a member of round t-1 alive (``abandoned``), and how many have joined round t (the waiting
line). Each was a request of its own: on etcd seven a wake, fourteen a second for one spare
at the soak's pace (heartbeat 0.5 s), more than the two members' liveness threads together
asked while the job trained (issue 41, session 56). They are one ``get_many`` now: one
transaction on etcd, the same reads one by one elsewhere. Nothing is read less often, so
every bound that rests on these reads stands (a spare leaves as soon as before when the job
ends; a round abandoned by all its members is opened as soon as before).
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.records import count_in


@dataclass(frozen=True)
class Wake:
    """One wake's reads of the store, for round ``t`` (``ahead``: the heartbeat keys read
    for the running round's watch, by key)."""

    open: bool
    stopped: bytes | None
    closed: bytes | None
    all_ok: bool
    joined: int
    ahead: dict[str, bytes | None]


def look(board: Board, t: int, ahead: str | None) -> Wake:
    """Read everything a wake of the wait for round ``t`` (> 0) needs in one round trip
    (``ahead``: the first heartbeat key the abandoned check judges; None: none known yet)."""
    keys = board.keys
    joined = keys.round(t, "joined")
    wanted = [keys.round(t, "open"), keys.stopped, keys.round(t - 1, "closed"),
              keys.round(t - 1, "all_ok"), joined, *([ahead] if ahead else [])]  # fmt: skip
    opened, stopped, closed, all_ok, present, *heard = board.get_many(wanted)
    return Wake(
        open=opened is not None,
        stopped=stopped,
        closed=closed,
        all_ok=all_ok is not None,
        joined=count_in(joined, present),
        ahead={ahead: heard[0]} if ahead else {},
    )
