"""A node that waits outside the running round -- a spare, or a newcomer queued behind it --
and loses the job's store follows the job to the store that succeeds it (design.md, "When
the store's host is lost").

Before, it went down with the store (its next read failed the join): the restart round on
the successor's store then had to wait for an agent started again, cold (torch imported
first), or for its last call, and in the c10d soak the lost store's host cost the most of
the twelve fault kinds. Now it looks at every candidate the members walk
(``Successors.candidates`` of the round that ran while it waited: read when it stood by,
since nothing can be read once the store is gone) and joins, as a client, the store a quorum
of the last round's members reached: the restart round there takes it at once.

How soon matters: the lost host's agent, started again, joins that round too, cold (its
template still imports torch), and whichever node comes first takes the place. The spare saw
the loss when its own wait on the store failed; the members serve and reach the successor's
store within about 0.1 s of finding it (at once where a worker fails first, as in training;
else within two heartbeats: ``health``). A look every 0.5 s found it not yet confirmed and
came back 0.5 s later, after the agent started again (the c10d soak: 0.48-0.55 s). So until
the members must have found the loss (two heartbeat intervals, and ``EVERY`` for their walk)
it looks every ``SOON``, then every ``EVERY``; and a look that finds a newer store not yet
confirmed waits on that store for its ``confirmed`` mark (one parked call, answered when the
mark is written: joined the moment the quorum completes) instead of looking again.

No split brain (design.md, "No split brain"): it never serves a store (only a member of the
last round walks to serve one, ``failover.walk``); it joins only a store newer than the one
it lost and *confirmed* (``majority.confirmed``: a quorum of the members reached it; a
member cut off from the others serves one that never is), or the lost store itself, when
that same store (its id) answers again; and where it joins it counts toward MIN only, never
toward the members' quorum. Where no round of ``majority.FEWEST`` members or more ran, no
failover can come, and it ends as before.

A node started after the failover with the job's one endpoint (the lost store's place) waits
on a fresh store there, which knows nothing of the job; the store's successor leaves word in
it (``backends.signpost``), and ``signposted`` follows that word, to a confirmed store only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence

from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.failover import TRY, Candidate, Failover, Move, Successors, epoch_of
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.majority import FEWEST, confirmed
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.dynamic.records import parsed
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import KVStore, Malformed, MalformedValue, StoreUnavailable

log = logging.getLogger("phalanx")

EVERY = 0.5  # seconds between two looks at the candidates (each try at most ``failover.TRY``)
# Between two looks while the members may still be finding the loss. A look tries each
# candidate once (a refused connection where nobody serves yet); once a newer store answers
# this node waits on it instead, so the store it follows is not asked more than before.
SOON = 0.05

Found = tuple[Candidate, KVStore, int]  # where, a client of the store there, its failover number


def running(board: Board) -> Membership | None:
    """The newest round that formed on ``board``'s store (a restart round still forming has
    no members yet: the round before it). Store errors propagate."""
    r = board.latest_round()
    for round_ in (r, r - 1):
        key = board.keys.round(round_, "members")
        found = board.get_json(key) if round_ >= 0 else None
        if found is not None and "fail" not in found:
            return parsed(key, found, Membership.from_json)
    return None


def signposted(board: Board, failover: Failover) -> Move | None:
    """The move to the job's store, when the job left word in ``board``'s store of where it
    went (a fresh store at the lost store's place, which this node serves or joined, given
    one endpoint: ``backends.signpost``): the store of that failover number or newer at the
    place named, confirmed (never a store no quorum of the members reached); None: no word,
    or no such store answers there now (asked again on the next call). Store errors on
    ``board``'s store propagate."""
    word = board.store.get(board.keys.moved)
    if word is None:
        return None
    try:
        said = json.loads(word)
        candidate, epoch = Candidate(str(said["host"]), int(said["port"])), int(said["epoch"])
    except (ValueError, KeyError, TypeError):
        return None  # not the job's word (only a holder of the token could write it)
    successors = failover.successors
    there = successors.reach(candidate, TRY) if epoch > failover.epoch else None
    if there is None:
        return None
    try:
        found = epoch_of(there, board.keys)
        if found >= epoch and confirmed(there, board.keys, found):
            log.warning(
                "rendezvous: the job's store at %s was lost and the job moved on (failover %d); "
                "its members left word there: this node, started at the lost store's place, "
                "follows it to %s", successors.current, found, candidate,
            )  # fmt: skip
            failover.epoch = found
            return Move(candidate, there, found, successors.moved(candidate))
    except (StoreUnavailable, ValueError):
        pass
    there.close()
    return None


def newest(
    candidates: Sequence[Candidate], successors: Successors, keys: Keys, lost: int
) -> tuple[Found | None, Found | None]:
    """Among the candidates, one try each: the confirmed store with the highest failover
    number past ``lost`` (the lost store's), or else the lost store itself answering again
    (``reach`` refuses another store at its place); None: neither answers. Second, only
    where the first is None: the newest store past ``lost`` not confirmed (yet), still open
    (the successor its survivors are still reaching, or a cut-off member's: never joined
    unconfirmed); None: none."""
    best: Found | None = None
    pending: Found | None = None
    for candidate in candidates:
        store = successors.reach(candidate, TRY)
        if store is None:
            continue
        try:
            epoch = epoch_of(store, keys)
            newer = epoch > lost and confirmed(store, keys, epoch)
            usable = newer or (epoch == lost and successors.is_current(candidate))
            unsure = epoch > lost and not newer
        except (StoreUnavailable, ValueError):
            usable = unsure = False
        if usable and (best is None or epoch > best[2]):
            if best is not None:
                best[1].close()
            best = (candidate, store, epoch)
        elif unsure and (pending is None or epoch > pending[2]):
            if pending is not None:
                pending[1].close()
            pending = (candidate, store, epoch)
        else:
            store.close()
    if best is not None and pending is not None:
        pending[1].close()
        pending = None
    return best, pending


def confirmation(pending: Found, keys: Keys, timeout: float) -> Found | None:
    """``pending`` (a store past the lost one, not confirmed when looked at) once a quorum of
    the last round's members reached it: waited on its ``confirmed`` mark, at most
    ``timeout`` seconds (one call the store answers when the mark is written); None, closed:
    not within it, or the store failed."""
    store = pending[1]
    try:
        if store.wait([keys.confirmed], timeout):
            return pending
    except StoreUnavailable:
        pass
    store.close()
    return None


class Follow:
    """The handler's: ``watch`` while this node stands by outside the running round, ``follow``
    once the store is lost meanwhile, ``reset`` when a join begins (``failover`` None: a
    store that never moves; then it does nothing)."""

    def __init__(
        self,
        failover: Failover | None,
        settings: RendezvousSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._f = failover
        # A spare waits as long as the job runs; the members find the loss within
        # heartbeat_timeout, walk and confirm the successor well within join_timeout.
        self._patience = settings.join_timeout
        # The members find a store whose host refuses them by two failed heartbeats (``health``).
        self._soon = 2 * settings.heartbeat_interval + EVERY
        self._clock = clock
        self._running: Membership | None = None  # the round this node waits behind

    def reset(self) -> None:
        """A join begins: this node stands by outside no round (yet)."""
        self._running = None

    def watch(self, board: Board, t: int = -1) -> None:
        """This node stands by on ``board``'s store for round ``t``, outside the round that
        runs: keep that round (its candidates, should the store be lost). A few reads, none
        once the round kept is round t-1 (called on every turn of the wait: a node that
        queued as round t-1 closed, before its members were written, found none at first --
        the c10d soak's spare that then had nothing to follow); a store that fails them keeps
        what was kept (the join's next call meets the failure)."""
        if self._f is None or (self._running is not None and self._running.round >= t - 1 >= 0):
            return
        with contextlib.suppress(StoreUnavailable, MalformedValue):
            self._running = running(board) or self._running

    def follow(self, keys: Keys, why: StoreUnavailable) -> Move | None:
        """The store was lost (``why``) while this node stood by: the move to the confirmed
        store that succeeds it (or back to the same one, answering again), once one does,
        at most ``join_timeout``; None: this node stood by outside no round, the store
        answered junk (not lost), no failover can come (a round of fewer than ``FEWEST``),
        or none came."""
        membership = self._running
        if self._f is None or membership is None or isinstance(why, Malformed):
            return None
        if membership.count < FEWEST:
            return None
        successors = self._f.successors
        lost, candidates = self._f.epoch, successors.candidates(membership)
        log.warning(
            "rendezvous: the job's store at %s was lost (%s) while this node waited outside "
            "round %d; looking for the store that succeeds it, at most %gs",
            successors.current, why, membership.round, self._patience,
        )  # fmt: skip
        start = self._clock()
        until, soon = start + self._patience, start + self._soon
        while True:
            found, pending = newest(candidates, successors, keys, lost)
            if found is not None:
                break
            left = until - self._clock()
            if left <= 0:
                if pending is not None:
                    pending[1].close()
                return None
            if pending is not None:  # joined the moment it is confirmed, not a look later
                if (found := confirmation(pending, keys, min(EVERY, left))) is not None:
                    break
            else:
                time.sleep(min(SOON if self._clock() < soon else EVERY, left))
        candidate, store, epoch = found
        self._f.epoch, self._running = epoch, None
        if epoch == lost:
            log.warning("rendezvous: the job's store at %s answers again: waiting there", candidate)
        else:
            log.warning(
                "rendezvous: the job's store moved (failover %d): this node, waiting outside "
                "the running round, follows it to %s", epoch, candidate,
            )  # fmt: skip
        return Move(candidate, store, epoch, successors.moved(candidate))
