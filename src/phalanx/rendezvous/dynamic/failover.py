"""Going on without the node that served the rendezvous store (design.md, "When the store's
host is lost"): the candidates to succeed it, the walk that finds the successor, what the
survivors re-publish on the new store. The quorum a restart round needs, so that two sides
of a partition never both run, is ``majority``'s. Store-agnostic: how a candidate serves a
store, or is reached at one, is the backend's (``Successors``; c10d's: ``backends.successor``).
The walk is pure (``tests/unit/test_failover.py`` drives it over the in-memory store)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from phalanx.errors import CUT_OFF_EXIT_CODE
from phalanx.rendezvous.api import RoundVerdict
from phalanx.rendezvous.dynamic.board import Board, Decision
from phalanx.rendezvous.dynamic.joined import JoinedRound
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.lost import Untold
from phalanx.rendezvous.dynamic.majority import FEWEST, confirmed
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.lastword import Reach
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import KVStore, StoreUnavailable

log = logging.getLogger("phalanx")

TRY = 1.0  # seconds one try at a candidate may take (a filtered port never answers)


@dataclass(frozen=True)
class Candidate:
    """A place a successor store may be served: ``host:port``; ``node_rank``: the member of
    the last round it is (candidates drawn from the members), None for a listed endpoint."""

    host: str
    port: int
    node_rank: int | None = None

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class Successors(Protocol):
    """How a backend serves and reaches a candidate's store."""

    current: Candidate  # where the store is served (the lost one's, until ``moved``)
    epoch: int  # the failovers before the store this node started on (0: the first store)

    def candidates(self, membership: Membership) -> list[Candidate]:
        """Every candidate, in the order every member knows (``membership``: the last round)."""

    def is_current(self, candidate: Candidate) -> bool:
        """Whether ``candidate`` is where the store that was lost is served."""

    def is_me(self, candidate: Candidate, rank: int) -> bool:
        """Whether ``candidate`` is this node (node rank ``rank`` in the last round)."""

    def at_member(self, candidate: Candidate, membership: Membership) -> bool:
        """Whether a member of ``membership`` is at ``candidate`` (it may serve there)."""

    def serve(self, candidate: Candidate, seed: dict[str, bytes]) -> KVStore | None:
        """Serve a store at ``candidate`` here, holding ``seed``; None: it cannot (said)."""

    def reach(self, candidate: Candidate, timeout: float) -> KVStore | None:
        """A client of the store at ``candidate`` once it answered within ``timeout`` (the
        token proved both ways, the run id checked); None when it did not."""

    def store_host(self, membership: Membership) -> int | None:
        """The node rank of the member that served the lost store (None: none of them)."""

    def moved(self, candidate: Candidate) -> Reach:
        """The store is at ``candidate`` from now on: how a fresh process reaches it."""

    def back(self, timeout: float) -> tuple[Candidate, KVStore] | None:
        """The store this node used before its last move, as a client, when that same store
        answers at its place again within ``timeout``; None when not."""


@dataclass(frozen=True)
class Move:
    """A move to the store of ``epoch`` at ``candidate`` (served by this node when ``reach``
    is None: else how a fresh process reaches it)."""

    candidate: Candidate
    store: KVStore
    epoch: int
    reach: Reach | None
    lost: tuple[str, float] | None = None  # going back: why it lost it, its last answer's time


def epoch_of(store: KVStore, keys: Keys) -> int:
    """How many failovers the store at hand is past the job's first store (0: the first)."""
    data = store.get(keys.epoch)
    return 0 if data is None else int(data)


def walk(
    candidates: Sequence[Candidate],
    successors: Successors,
    rank: int,
    epoch: int,
    keys: Keys,
    patience: float,
    clock: Callable[[], float] = time.monotonic,
    idle: Collection[Candidate] = (),
) -> tuple[Candidate, KVStore, bool] | None:
    """Find the store of ``epoch`` (one past the lost one): the first candidate alive
    serves it, every other survivor finds it. The lost store's place gets one try (it
    answers after all, and no other candidate serves the new store yet: None, rejoin it);
    this node's place, it serves there (or, if it cannot, walks on); any other is tried for
    ``patience`` seconds, but one no member is at (``idle``: a spare's) once. Returns
    where, the store, and whether this node serves it; None: the lost store answers or
    nobody serves."""
    for candidate in candidates:
        if successors.is_current(candidate):
            store = successors.reach(candidate, TRY)
            if store is not None:
                store.close()
                # Back from a pause just now? Another survivor may have moved already.
                moved = superseded(candidates, successors, rank, epoch - 1, keys, 0, clock)
                found = None if moved is None else successors.reach(moved, TRY)
                return None if moved is None or found is None else (moved, found, False)
        elif successors.is_me(candidate, rank):
            later = _served_later(candidates, candidate, successors, epoch, keys)
            if later is not None:
                return later
            seed = {keys.epoch: str(epoch).encode()}
            if (store := successors.serve(candidate, seed)) is not None:
                return candidate, store, True
        elif candidate in idle:  # no member there, who could serve: one try (it served?)
            if (store := _store_at(candidate, successors, TRY, epoch, keys)) is not None:
                return candidate, store, False
        elif (store := _wait_for(candidate, successors, epoch, keys, patience, clock)) is not None:
            return candidate, store, False
    return None


def _served_later(
    candidates: Sequence[Candidate],
    me: Candidate,
    successors: Successors,
    epoch: int,
    keys: Keys,
) -> tuple[Candidate, KVStore, bool] | None:
    """The store of ``epoch``, when a candidate after this node already serves it, one try
    each: a survivor that waited for this node in vain (this one late, under load) served
    it, and serving a second one would split the survivors into two stores, neither with a
    quorum. This node joins it instead; None: none does, this node serves."""
    for candidate in candidates[candidates.index(me) + 1 :]:
        if successors.is_current(candidate):
            continue
        if (store := _store_at(candidate, successors, TRY, epoch, keys)) is not None:
            return candidate, store, False
    return None


def _store_at(
    candidate: Candidate,
    successors: Successors,
    timeout: float,
    epoch: int,
    keys: Keys,
    sure: bool = False,
) -> KVStore | None:
    """The store at ``candidate`` when it answers within ``timeout``, of ``epoch`` or newer
    (``sure``: and confirmed); None (closed): no answer, older, unconfirmed or junk."""
    store = successors.reach(candidate, timeout)
    if store is None:
        return None
    try:
        found = epoch_of(store, keys)
        if found >= epoch and (not sure or confirmed(store, keys, found)):
            return store
    except (StoreUnavailable, ValueError):
        pass
    store.close()
    return None


def _wait_for(
    candidate: Candidate,
    successors: Successors,
    epoch: int,
    keys: Keys,
    patience: float,
    clock: Callable[[], float],
) -> KVStore | None:
    """The store of ``epoch`` at ``candidate``, once it answers (at most ``patience``)."""
    until = clock() + patience
    while True:
        store = _store_at(candidate, successors, min(TRY, max(0.01, until - clock())), epoch, keys)
        if store is not None:
            return store
        if clock() >= until:
            return None
        time.sleep(min(0.25, max(0.0, until - clock())))


def superseded(
    candidates: Sequence[Candidate],
    successors: Successors,
    rank: int,
    epoch: int,
    keys: Keys,
    patience: float,
    clock: Callable[[], float] = time.monotonic,
    sure: bool = False,
) -> Candidate | None:
    """For a store host that fenced itself (frozen, cut off): the candidate that serves a
    newer store than its own (the others failed over while it was away), looked for among
    the others, one try each, round after round for ``patience`` seconds; None: none does.
    ``sure``: only a confirmed one counts (a member cut off like this host may serve a store
    of its own, which no majority joined: it must not make the host give up)."""
    others = [c for c in candidates if not (successors.is_me(c, rank) or successors.is_current(c))]
    until = clock() + patience
    while others:
        for candidate in others:
            store = _store_at(candidate, successors, TRY, epoch + 1, keys, sure)
            if store is not None:
                store.close()
                return candidate
        if clock() >= until:
            return None
        time.sleep(0.25)
    return None


def republish(
    board: Board,
    membership: Membership,
    lost: int | None,
    why: str,
    since: float,
    verdict: RoundVerdict | None,
) -> None:
    """Re-publish on the new store what the lost one held that the job needs next: round
    ``membership.round`` as it closed (its members with the job's restart count: the
    budget), the lost host's place (member ``lost``) settled as lost with its record and
    ``NODE_LOST`` (posted once: by whoever settles it), and the job's verdict on the round
    before (the crash-loop evidence). Every survivor calls it: each write is first-wins, the
    same value from anyone. Store errors propagate (``StoreUnavailable``)."""
    keys, r = board.keys, membership.round
    board.put_first(keys.round(r, "members"), membership.to_json())
    board.close(r, Decision(count=membership.count))
    board.open_round(r)
    board.store.set(keys.round(r, "failover"), b"1")  # the next round needs a strict majority
    if verdict is not None and r > 0:
        board.propose_verdict(r - 1, verdict)
    if lost is not None and board.settle(r, lost, membership.count, "lost"):
        Untold(membership, lost, why, since).tell(board)


def unanswered(board: Board) -> str | None:
    """Why the store does not answer one bounded call now (None: it answers)."""
    try:
        board.latest_round()
    except StoreUnavailable as exc:
        return str(exc)
    return None


def _named(membership: Membership, rank: int | None, where: Candidate) -> str:
    """Member ``rank`` as the lines name a node; ``where`` when it is none."""
    if rank is None or rank >= membership.count:
        return str(where)
    node = membership.nodes[rank]
    return f"node {rank} ({node.hostname}, {node.addr})"


class Failover:
    """This node's side of the store's failovers (the handler's): the epoch of its store."""

    def __init__(self, successors: Successors, settings: RendezvousSettings) -> None:
        self.successors = successors
        self.epoch = successors.epoch
        self.last: dict[str, object] | None = None  # the last move, as the event log says it
        self._lost = ("", 0.0)  # why this node lost the store it left last, and when
        # How long a survivor waits for an earlier candidate to serve: the survivors find
        # the loss up to a heartbeat_timeout apart (a fence, an expired heartbeat), and the
        # earlier one first gives the lost store a try; a late one joins a later candidate
        # that served in its place (``_served_later``) rather than serve a second store.
        self._patience = 2 * settings.heartbeat_timeout

    def move(
        self,
        keys: Keys,
        node_id: str,
        membership: Membership,
        rank: int,
        why: str,
        since: float,
        verdict: RoundVerdict | None,
    ) -> Move | None:
        """After this member (``rank`` of ``membership``) lost the store (``why``, its last
        answer at wall-clock ``since``): find the successor, re-publish the job's state
        there, and return the move; None: the lost store answers after all, or nobody serves."""
        epoch, candidates = self.epoch + 1, self.successors.candidates(membership)
        idle = [c for c in candidates if not self.successors.at_member(c, membership)]
        found = walk(candidates, self.successors, rank, epoch, keys, self._patience, idle=idle)
        if found is None:
            return None
        candidate, store, served = found
        lost = self.successors.store_host(membership)
        lost_name = _named(membership, lost, self.successors.current)
        by = candidate.node_rank  # a listed endpoint: the member at its address, if one is
        if by is None:
            by = next((n.node_rank for n in membership.nodes if n.addr == candidate.host), None)
        successor = _named(membership, by, candidate)
        how = (
            f"served the rendezvous store and was lost ({why}); {successor} serves it now "
            f"at {candidate} (failover {epoch})"
        )
        try:
            republish(Board(store, keys, node_id), membership, lost, how, since, verdict)
        except StoreUnavailable as exc:
            log.warning("rendezvous: the new store at %s failed at once: %s", candidate, exc)
            store.close()
            return None
        self.epoch, self._lost = epoch, (why, since)
        log.warning(
            "rendezvous: the store's host, %s, is lost; %s serves the rendezvous store now at "
            "%s (failover %d)%s", lost_name, successor, candidate, epoch,
            " (this node)" if served else "",
        )  # fmt: skip
        self.last = {
            "round": membership.round, "lost_node": lost, "lost_host": lost_name,
            "successor_node": by, "successor": successor,
            "endpoint": str(candidate), "epoch": epoch,
        }  # fmt: skip
        reach = self.successors.moved(candidate)
        return Move(candidate, store, epoch, None if served else reach)

    def after_loss(
        self, keys: Keys, node_id: str, hosting: bool, joined: JoinedRound, why: str, since: float
    ) -> Move | str | None:
        """This node lost the store of its round ``joined`` (``why``; its last answer at
        wall-clock ``since``): the move to the successor's store; why it must stop (it
        served the lost store, and the others moved on: ``superseded``); None, no failover
        (a round of 2; the lost store answers after all; nobody serves)."""
        membership, rank = joined.membership, joined.rank
        if membership.count < FEWEST:
            return None
        if hosting:
            return self.superseded(keys, membership, rank)
        return self.move(keys, node_id, membership, rank, why, since, joined.before)

    def back(self, leave: Callable[[KVStore], bool]) -> Move | None:
        """This node serves the store it failed over to, which no quorum reached: the move
        back to the store it lost, when that store answers at its place again and
        ``leave(that store)`` (``goback``: whether to go, the round waiting here then failed);
        None when it does not answer, or ``leave`` says stay."""
        found = self.successors.back(TRY)
        if found is None:
            return None
        candidate, store = found
        try:
            going = leave(store)
        except StoreUnavailable:
            going = False
        if not going:
            store.close()
            return None
        self.epoch -= 1
        log.warning(
            "rendezvous: the store this node lost, at %s, answers again: going back to it, as a "
            "member of the last round, and leaving the store this node served (failover %d), "
            "which no quorum of that round's members reached",
            candidate, self.epoch + 1,
        )  # fmt: skip
        return Move(candidate, store, self.epoch, self.successors.moved(candidate), self._lost)

    def waiting_at(self, first: str) -> str:
        """The store it uses, as the waiting line names it (``first``: the job's first)."""
        if self.epoch == 0:
            return first
        return f"the store that took over, at {self.successors.current} (failover {self.epoch})"

    def take(self) -> dict[str, object] | None:
        """The last move, as the event log says it, once (None: none since)."""
        last, self.last = self.last, None
        return last

    def superseded(self, keys: Keys, membership: Membership, rank: int) -> str | None:
        """For this node, which served the store and fenced itself: why it must stop, when
        the others moved the job to a successor while it was away; None: they did not."""
        candidates = self.successors.candidates(membership)
        found = superseded(
            candidates, self.successors, rank, self.epoch, keys, self._patience, sure=True
        )
        if found is None:
            return None
        return (
            f"superseded: while this node was away (frozen or cut off), the other nodes moved "
            f"the job's rendezvous store to {_named(membership, found.node_rank, found)} at "
            f"{found}; this node, which served the old one, is out of the job, which goes on "
            f"there without it (exit {CUT_OFF_EXIT_CODE})"
        )
