"""No split brain where the store may move (c10d): who counts toward a restart round's
quorum, the mark a failover store gets once a round formed on it, and which store a node
that starts (or comes back) joins (design.md, "No split brain").

A restart round after a round of 3 or more members needs, besides MIN nodes, enough of the
LAST round's members: a strict majority on a store that took over from a lost one, at least
half on the store that stayed. Only members count: a newcomer or a spare could side with
either half of a partition, so counting it would let both halves run. Two strict majorities
of one member set always share a member, and a member joins one store per failover number,
so two failover stores never both form a round; a half and a strict majority cannot both
exist either, so the old store and a successor never both run.

A store that took over is *confirmed* once a quorum of the last round's members reached it
(``confirm``; before its round closes, which may need one more node for MIN). A node cut off
from the others that served a store of its own never gets that mark, and nodes that start
later never join such a store (``choose``): they wait for a confirmed one. A node whose restart
round failed short of the quorum is out of the job (``ended``: ``CutOff``, its own exit code),
not the job's failure: the others may go on.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

from phalanx.errors import CutOff, RendezvousError
from phalanx.rendezvous.dynamic.board import Board, Decision
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.lost import Untold
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.dynamic.records import encode, parsed
from phalanx.rendezvous.stores.base import KVStore

FEWEST = 3  # a round of 2 never fails over: its survivor could never be a majority
CUT_OFF = "cut off: "  # how a restart round that lacks the members' quorum failed


def majority(members: int, failed_over: bool) -> int:
    """The fewest members of the last round (of ``members``) a restart round needs: on a
    store that took over from a lost one (``failed_over``) a strict majority, on the store
    that stayed at least half; 0 below ``FEWEST`` (a job of 2 never fails over)."""
    if members < FEWEST:
        return 0
    return members // 2 + 1 if failed_over else (members + 1) // 2


def quorum(min_nodes: int, members: int, failed_over: bool) -> int:
    """The fewest nodes a restart round may form with (MIN, and the members' majority)."""
    return max(min_nodes, majority(members, failed_over))


def short_of(
    min_nodes: int, joined: int, members: int, rejoined: int, failed_over: bool, r: int
) -> str | None:
    """Why a restart round after round ``r`` may not form with ``joined`` arrivals,
    ``rejoined`` of them members of round ``r`` (of ``members``); None: it may. Newcomers
    and spares count toward MIN, never toward the members' majority."""
    need = majority(members, failed_over)
    if rejoined < need:  # (each starts with CUT_OFF: the nodes that read it are ``CutOff``)
        if failed_over:
            return (
                f"{CUT_OFF}only {rejoined} of the last round's {members} members reached the "
                f"store that took over after round {r} (at least {need} needed); no round "
                "forms there"
            )
        return (
            f"{CUT_OFF}only {rejoined} of the last round's {members} members are left on this "
            f"store after round {r} (at least {need} needed); no round forms here"
        )
    if joined < min_nodes:
        return f"only {joined} node(s) are left after round {r}; at least {min_nodes} needed"
    return None


def ended(failure: str, reason: str = "") -> RendezvousError:
    """What a node that finds its round failed raises (``failure``, the round's decision;
    ``reason``: the job's stop reason, when that is what it read first): a round short of
    the members' quorum (``short_of``) puts every node on that store out of the job
    (``CutOff``), which goes on where a quorum met, if one did."""
    stop = re.fullmatch(r"round \d+ failed: (.*)", reason, re.DOTALL)  # ``Board.close``'s
    why = stop.group(1) if stop is not None else failure
    if not why.startswith(CUT_OFF):
        return RendezvousError(failure)
    return CutOff(
        f"{why}: this node is out of the job, which goes on without it on the side that "
        "reached a quorum of its members, if one did (their nodes report how it ends); check "
        f"this node's network links to the other nodes (exit {CutOff.exit_code})"
    )


def failed_over(board: Board, r: int) -> bool:
    """Whether round ``r`` was re-published on a store that took over from a lost one."""
    return board.store.get(board.keys.round(r, "failover")) is not None


def rejoined(board: Board, r: int) -> int:
    """How many members of round ``r`` rejoined (settled, and not gone: lost or left)."""
    settled, gone = board.counters([board.keys.round(r, "settled"), board.keys.round(r, "gone")])
    return settled - gone


def close_restart(board: Board, t: int, joined: int, nodes: tuple[int, int]) -> Decision:
    """Close restart round ``t`` (its round t-1 settled) with ``joined`` arrivals, or fail
    it (``short_of``); a round formed on a store that took over confirms it (``confirm``).
    Returns the decision that won."""
    low, high = nodes
    before = board.decision(t - 1)
    moved = failed_over(board, t - 1)
    members = 0 if before is None or before.failed else before.count
    why = short_of(low, joined, members, rejoined(board, t - 1), moved, t - 1)
    decision = board.close(t, Decision(failure=why) if why else Decision(count=min(joined, high)))
    if moved and not decision.failed:
        confirm(board, t)
    return decision


def confirm(board: Board, r: int) -> None:
    """A quorum of the last round's members reached this store, one that took over, for
    round ``r`` (or round ``r`` formed on it). Marked with the store's failover number and
    the round (first write wins)."""
    epoch = int(board.store.get(board.keys.epoch) or b"0")
    mark = encode({"epoch": epoch, "round": r})
    board.store.compare_set(board.keys.confirmed, None, mark)


def confirmed(store: KVStore, keys: Keys, epoch: int) -> bool:
    """Whether the store (of failover ``epoch``) may be joined by a node that starts: the
    job's first store, or one a quorum of the last round's members reached. Store errors
    propagate."""
    return epoch == 0 or store.get(keys.confirmed) is not None


def forming(store: KVStore, keys: Keys) -> bool:
    """Whether the job's newest round on this store is open and not yet closed: the job's
    members are there now, forming it (a restart round that may wait for one more node).
    Store errors propagate."""
    data = store.get(keys.latest_round)
    r = 0 if data is None else int(data)
    opened = r == 0 or store.get(keys.round(r, "open")) is not None
    return opened and store.get(keys.round(r, "closed")) is None


def choose(seen: Sequence[tuple[int, bool, bool]]) -> tuple[int | None, bool]:
    """Among the stores found (each ``(epoch, confirmed, forming)``): the index of the
    confirmed one with the highest failover number (None: none), and whether to look again
    before joining it: an unconfirmed store newer than it may be the job's successor,
    forming. Not while the confirmed one forms a round: its members are there, and a restart
    round short of MIN would fail for want of this node (soak seed 4141: it waited on a
    cut-off node's store while the job's last call ran out). Joining it is safe either way:
    a newcomer counts toward MIN only, never toward the last round's quorum."""
    best: int | None = None
    for i, (epoch, sure, _) in enumerate(seen):
        if sure and (best is None or epoch > seen[best][0]):
            best = i
    if best is not None and seen[best][2]:
        return best, False
    floor = -1 if best is None else seen[best][0]
    return best, any(not sure and epoch > floor for epoch, sure, _ in seen)


def expire_late(
    board: Board,
    r: int,
    timeout: float,
    clock: Callable[[], float],
    between: Callable[[int], None] = lambda t: None,
) -> None:
    """On a store that took over, before restart round r+1 closes: wait while a member of
    round ``r`` has not come (``keepalive``; ``timeout``: heartbeat_timeout), then settle
    each one still missing as lost, each told once (``Untold``). A member that reached the
    store settled itself first; the lost host was settled when the round was re-published.
    ``between(r + 1)``: called before each wait (it may raise: ``goback``)."""
    keys = board.keys
    settled, key = keys.round(r, "all_settled"), keys.round(r, "members")
    found = board.get_json(key)
    if found is None:
        return
    membership = parsed(key, found, Membership.from_json)

    def missing() -> bool:
        return board.store.get(settled) is None and board.decision(r + 1) is None

    def quorate() -> bool:
        if rejoined(board, r) < majority(membership.count, True):
            return False
        confirm(board, r + 1)
        return True

    # The member that completes the quorum confirms the store at once, before the round
    # closes: where MIN needs one more node (the spare, the lost host started again), that
    # node joins only a confirmed store.
    quorate()

    def wait(seconds: float) -> bool:
        between(r + 1)
        return board.store.wait([settled], seconds)

    if keepalive(missing, quorate, timeout, wait, clock):
        return
    epoch = int(board.store.get(keys.epoch) or b"0")
    why = (
        f"did not reach the store that took over (failover {epoch}) before its keepalive "
        "expired: lost with the store's host"
    )
    for rank in range(membership.count):
        if board.settle(r, rank, membership.count, "lost"):
            Untold(membership, rank, why).tell(board)


def keepalive(
    missing: Callable[[], bool],
    quorate: Callable[[], bool],
    timeout: float,
    wait: Callable[[float], bool],
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """On a store that took over: wait while a member of the last round is ``missing``
    (``wait(seconds)``: True once none is). A missing member's keepalive expires
    ``timeout`` (heartbeat_timeout) after this node came, once the members here are a
    quorum (``quorate``); without one, after three times that: a survivor that found the
    loss a heartbeat_timeout late walks to the successor within twice it (the walk's
    patience). Returns True when none is missing, False when the rest are to be expired."""
    start = clock()
    while missing():
        waited = clock() - start
        if waited >= 3 * timeout or (waited >= timeout and quorate()):
            return False
        if wait(min(timeout / 4, 3 * timeout - waited)):
            return True
    return True
