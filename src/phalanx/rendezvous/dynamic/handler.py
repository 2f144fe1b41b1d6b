"""The multi-node ``RendezvousHandler`` over any ``KVStore`` (c10d, static and etcd use it).

Elastic ``MIN:MAX``, stable node ranks, a job-wide restart count, failure reach: the join
algorithm is in ``formation``, the heartbeat/event thread in ``liveness``, the keys in ``keys``;
static rendezvous is this handler with ``min = max = nnodes``, each ``--node-rank`` fixed.

Liveness is by heartbeat counters, or by keys bound to the node's lease where the store has
leases (etcd): see ``pulse``. Either way the node fences itself (``fence()``; see
``phalanx.rendezvous.fencing``) when no write has proved it alive for ``fence_after``.

Store trouble: ``next_round`` raises ``RendezvousError`` (a spare follows a lost store:
``follow``); ``report_done`` and ``shutdown`` only log it; ``failures`` returns nothing once the
store counts as lost. Its parts live beside it (``joined``, ``barrier``, ``nodefence``,
``stopping``, ``exchange``, ``departure``, ``failover``; growth: ``sweep``); here is its state
(its last round, what ``report_done`` said, the wiring ``rejoin`` renews)."""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Callable, Mapping

from phalanx.config import shown_run_id
from phalanx.errors import CutOff, RendezvousError, UsageError
from phalanx.rendezvous.api import EventKind, JobEvent
from phalanx.rendezvous.dynamic.barrier import ExitBarrier
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.departure import Departure
from phalanx.rendezvous.dynamic.failover import Failover, Move, Successors, unanswered
from phalanx.rendezvous.dynamic.follow import Follow
from phalanx.rendezvous.dynamic.formation import RoundFormer
from phalanx.rendezvous.dynamic.goback import GoBack, StoreBack
from phalanx.rendezvous.dynamic.joined import JoinedRound, Wires
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.liveness import Liveness
from phalanx.rendezvous.dynamic.lost import store_answers, tell_rejoining
from phalanx.rendezvous.dynamic.members import Arrival
from phalanx.rendezvous.dynamic.nodefence import fence_for
from phalanx.rendezvous.dynamic.stopping import placed_in, tell_left_while_joining
from phalanx.rendezvous.dynamic.sweep import Sweeper
from phalanx.rendezvous.fencing import Fence
from phalanx.rendezvous.lastword import Reach, Word, word
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import KVStore, Malformed, RenewingStore, StoreUnavailable

log = logging.getLogger("phalanx")


class DynamicRendezvous:
    """One node's side of a multi-node rendezvous. Owns ``store`` (``shutdown`` closes it).
    Constructing it does no I/O; the heartbeat thread starts when the first round forms."""

    _stopped_by: int | None  # the signal that stopped this node (report_done)

    def __init__(
        self,
        store: KVStore,
        *,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        addr: str,
        settings: RendezvousSettings | None = None,
        hostname: str | None = None,
        fixed_rank: int | None = None,
        node_id: str | None = None,
        worker_port: int | None = None,
        fingerprint: Mapping[str, str] | None = None,
        where: str = "",
        admit_mismatch: bool = False,
        reach: Reach | None = None,
        successors: Successors | None = None,
        max_restarts: int = 0,
    ) -> None:
        """``addr``: where the other nodes reach this one (MASTER_ADDR if it gets rank 0);
        ``where``: the store, as the waiting line names it. ``fixed_rank``: static rendezvous
        (``min_nodes == max_nodes``); ``worker_port``: the workers' MASTER_PORT in every
        round (None: a free port per round). ``fingerprint``: what this node announces of
        its code and versions with every join (``phalanx.consistency``); each round's result
        carries every member's. ``admit_mismatch``: join a running job even when its
        fingerprint differs (else this node is refused before the job hears of it).
        ``reach``: how a fresh process opens ``store`` as a client (for its ``lastword``);
        ``successors``: where the store may move (``failover``; None: never). ``max_restarts``:
        the budget it spends if every member of the round it waits behind is gone."""
        # The node range was checked with the spec (registry.check), once.
        if fixed_rank is not None and min_nodes != max_nodes:
            raise UsageError("static rendezvous needs a fixed --nnodes N, not MIN:MAX")
        self._settings = settings or RendezvousSettings()
        self._store = store
        self._shape = (min_nodes, max_nodes, worker_port, where, admit_mismatch, max_restarts)
        self._fence = fence_for(store, self._settings)
        self._addr = addr
        self._hostname = hostname or socket.gethostname()
        self._fixed_rank = fixed_rank
        self._fingerprint = dict(fingerprint or {})
        self._stopped_by, self._preempted = None, False  # and whether it was a preemption
        self._closed = self._joining = False  # ``_joining``: ``next_round`` began, not returned
        self._ring: Callable[[], None] | None = None  # ``on_event``'s
        # A store this node hosts dies with its agent: nobody would hear the last word.
        self._reach = None if store.hosting else reach
        self._heard: Callable[[Word | None], None] | None = None  # ``on_last_word``'s
        self._spare_work: Callable[[Callable[[], bool]], None] = lambda needed: None
        self._joined: JoinedRound | None = None  # the last round this node joined
        self._failover = None if successors is None else Failover(successors, self._settings)
        self._goback = None if self._failover is None else GoBack(self._failover, self._settings)
        self._follow = Follow(self._failover, self._settings)  # a spare that loses the store
        self._superseded: str | None = None  # why this store host stopped: the store moved
        self._sweeper = Sweeper()  # node rank 0's sweep of the rounds before (``sweep``)
        self._wire(run_id, node_id or uuid.uuid4().hex)

    def _wire(self, run_id: str, node_id: str) -> None:
        """This node as member ``node_id`` of run ``run_id``: its board, round former,
        heartbeats, barrier and departure (the last round joined is kept)."""
        min_nodes, max_nodes, worker_port, where, admit_mismatch, max_restarts = self._shape
        self._node_id = node_id
        self._board = board = Board(self._store, Keys(run_id), node_id)
        self._former = RoundFormer(
            board, self._settings, min_nodes, max_nodes, worker_port=worker_port, back=self._back,
            where=where if self._failover is None else self._failover.waiting_at(where),
            admit_mismatch=admit_mismatch, arriving=self._arriving, max_restarts=max_restarts,
            standing_by=self._standing_by, majority=self._failover is not None,
            idle=lambda needed: self._spare_work(needed),
        )  # fmt: skip
        self._liveness = liveness = Liveness(board, self._settings, fence=self._fence)
        if self._ring is not None:
            liveness.on_event(self._ring)
        self._done: bool | None = None  # what report_done said
        self._junk = False  # the join failed on a malformed reply: nothing more to tell it
        self._wires = Wires(board, liveness, ExitBarrier(board, self._settings, self.poll))
        self._departure = Departure(board, self._store, liveness, self._settings, self._hostname, node_id, run_id)  # fmt: skip
        self._tell_last_word()

    def rejoin(self, failover_only: bool = False) -> bool:
        """After this node lost the store or fenced itself: move to a successor's store
        (``failover``), or wait until the store answers again (at most ``close_timeout``: a
        store gone for good ends the job soon), then be a new member of the run -- a fresh
        node id, heartbeats and fence -- for the next round (the others counted the old one
        lost). ``failover_only`` (its workers failed: the store's host may have gone with
        their peers): only a failover, once the store does not answer; but as without it when
        the store counts as lost here too, or this node fenced (which of the two the agent
        heard first is a race: a paused store host hears both at once). False when the store
        stayed out of reach, and on etcd, where the lease expired with it (its keys too)."""
        if self._closed or isinstance(self._store, RenewingStore):
            return False
        why = self._liveness.store_problem()
        if failover_only and why is not None:
            failover_only = False
            log.warning("rendezvous: %s; rejoining the job when the store answers again", why)
        if failover_only and self._failover is not None:
            why = unanswered(self._board)
        if why is None or (failover_only and self._failover is None):
            return False  # not lost: nothing to come back from
        gone = time.time() - (time.monotonic() - self._liveness.last_answer())  # (wall clock)
        if not failover_only:  # (else it beats on until it moves: it may not)
            self._liveness.stop()
        moved = self._fail_over(why, gone)
        if moved is not None or failover_only:
            return bool(moved)
        if not store_answers(self._board, self._settings):
            return False
        if self._fence is not None:
            self._fence.rearm()
        if self._joined is not None:  # before it waits: the old round's members stop at once
            joined = self._joined
            tell_rejoining(self._board, joined.membership, joined.rank, why, gone)
        # As a member of the last round (``_joined`` kept) it opens the next and joins it, its
        # old place settled as rejoined (unless found lost): the job re-forms if all lost it.
        self._wire(self._board.keys.run_id, uuid.uuid4().hex)
        log.info("rendezvous %r: the store answers again; rejoining as a new member", self.run_id)
        return True

    def _fail_over(self, why: str, since: float) -> bool | None:
        """The store's host is lost: True, moved to a successor's store; None: no failover
        (``failover``). Raises ``CutOff`` when this node served it and the others moved on."""
        joined = self._joined
        if self._failover is None or joined is None:
            return None
        keys, hosting = self._board.keys, self._store.hosting
        found = self._failover.after_loss(keys, self._node_id, hosting, joined, why, since)
        if isinstance(found, str):  # out of the job, which goes on on the new store
            self._superseded = found
            raise CutOff(found)
        if found is None:
            return None
        self._switch(found)
        return True

    def _back(self, t: int) -> None:
        if self._goback is not None:  # (raises ``StoreBack``: see ``next_round``)
            self._goback.check(self._board, t, newcomer=self._joined is None)

    def _switch(self, move: Move) -> None:
        """On to the store ``move`` found: a successor's; or, ``move.lost`` set, back to the
        one this node lost (``goback``), told as a member coming back (``tell_rejoining``)."""
        self._liveness.stop()
        old, self._store = self._store, move.store
        old.close()
        self._reach = move.reach
        if self._fence is not None:
            self._fence.rearm()
        if move.lost is not None and self._joined is not None:
            joined, board = self._joined, Board(self._store, self._board.keys, self._node_id)
            tell_rejoining(board, joined.membership, joined.rank, *move.lost)
        self._wire(self._board.keys.run_id, uuid.uuid4().hex)  # its old place: rejoined

    def store_moved(self) -> dict[str, object] | None:
        return None if self._failover is None else self._failover.take()

    @property
    def run_id(self) -> str:
        return self._board.keys.run_id

    @property
    def node_id(self) -> str:
        return self._node_id

    # -- RendezvousHandler -----------------------------------------------------------------
    def next_round(self, local_world_size: int) -> JoinedRound:
        if self._closed or self._done is not None:
            raise RendezvousError("this node already left the rendezvous")
        if (problem := self._liveness.store_problem()) is not None:
            raise RendezvousError(problem)
        # (``prior``: None once this node followed the store as a spare: no member there)
        last, prior, self._joining = self._joined, self._joined, True
        self._follow.reset()
        try:
            while True:
                self._liveness.announce()
                self._liveness.start()  # beats while joining: see ``Liveness``
                try:
                    membership, rank, (addr, port) = self._former.form(
                        self._arrival(local_world_size),
                        None if prior is None else prior.membership,
                        None if prior is None else prior.rank,
                    )
                    break
                except StoreBack as back:  # the store it lost answers again: join it there
                    self._switch(back.move)
                except StoreUnavailable as exc:  # lost while this node stood by: follow the job
                    if (moved := self._follow.follow(self._board.keys, exc)) is None:
                        raise
                    self._switch(moved)
                    prior = None
            if rank == 0:  # (off the round's path: the others need not wait, nor this node)
                self._sweeper.start(self._board, membership)
        except StoreUnavailable as exc:
            # A store that answered junk answers the leave's write with the same junk.
            self._junk = isinstance(exc, Malformed)
            raise RendezvousError(f"rendezvous {shown_run_id(self.run_id)}: {exc}") from None
        self._liveness.follow(membership, rank)
        log.info(
            "rendezvous %r round %d: node rank %d of %d, master %s:%d, restart %d",
            self.run_id, membership.round, rank, membership.count, addr, port,
            membership.restart_count,
        )  # fmt: skip
        # The round's calls go over the wiring of the time: a rejoin renews it under them.
        self._joined = JoinedRound(
            self.run_id, membership, rank, (addr, port), lambda: self._wires, self._settings,
            self._hostname, before=None if last is None else last.verdict,
        )  # fmt: skip
        self._joining = False
        return self._joined

    def _arrival(self, local_world_size: int) -> Arrival:
        """This node as it asks to join the next round (where it was in the last one)."""
        last = self._joined
        return Arrival(
            node_id=self._node_id, hostname=self._hostname, addr=self._addr,
            local_world_size=local_world_size, prev_rank=-1 if last is None else last.rank,
            prev_round=-1 if last is None else last.membership.round,
            fixed_rank=self._fixed_rank, hosts_store=self._store.hosting,
            fingerprint=self._fingerprint,
        )  # fmt: skip

    def _standing_by(self, t: int, waiting: bool) -> None:
        """It waits for round ``t`` outside the running round: no fence (a pause must not count)."""
        if self._fence is not None and not waiting:
            self._fence.stand_down()
        self._follow.watch(self._board, t)  # the store lost meanwhile, it follows the job

    def _arriving(self) -> None:
        """This node, stood by, takes a slot in a round: its fence arms from now."""
        if self._fence is not None:
            self._fence.arrived()

    def peers(self) -> DynamicRendezvous:
        return self  # this node's side of the others: ``Peers``

    def fence(self) -> Fence | None:
        return self._fence

    def job_running(self) -> bool:
        return self._fixed_rank is None and self._board.running()

    @property
    def quiet(self) -> bool:
        return False  # peers' events and the store's loss arrive through ``poll``

    def on_event(self, ring: Callable[[], None]) -> None:
        self._ring = ring  # kept: a rejoin wires new heartbeats, which ring it too
        self._liveness.on_event(ring)

    def while_spare(self, work: Callable[[Callable[[], bool]], None]) -> None:
        self._spare_work = work  # (``formation``'s ``idle``)

    def on_last_word(self, listener: Callable[[Word | None], None]) -> None:
        self._heard = listener
        self._tell_last_word()

    def poll(self) -> JobEvent | None:
        if self._superseded is not None:
            return JobEvent(EventKind.STORE_LOST, detail=self._superseded)
        if (problem := self._liveness.store_problem()) is not None:
            return JobEvent(EventKind.STORE_LOST, detail=problem)
        return self._liveness.next_event()

    def stop_heard(self) -> JobEvent | None:
        return self._liveness.stop_heard()

    def failures(self) -> list[dict[str, object]]:
        """Empty once the store is lost: asking would only wait out its timeout again."""
        if self._liveness.store_problem() is not None:
            return []
        try:
            return self._board.failures()
        except StoreUnavailable as exc:
            raise RendezvousError(f"rendezvous {shown_run_id(self.run_id)}: {exc}") from None

    def report_done(self, ok: bool, *, signum: int | None = None, preempted: bool = False) -> None:
        if signum is not None and self._stopped_by is None:
            self._stopped_by = signum
            self._preempted = preempted
        if not ok:
            self._liveness.settle()  # fenced: learn what became of the store, bounded
        joined = self._joined
        if self._done is True and not ok and joined is not None:
            self._done = False  # the job failed elsewhere after this node's workers finished
            joined.stop_job(self._stopped_by, self._preempted)
            return
        if self._done is None and not ok and self._left_while_joining(joined):
            self._done = False
            return
        if self._done is not None or joined is None:
            self._done = ok if self._done is None else self._done
            return
        self._done = ok
        self._liveness.stop_beating()
        # Leaving on purpose from here: an agent that dies now is not to be counted lost.
        self._tell_last_word(withdrawn=True)
        if self._liveness.store_problem() is not None:
            return  # nobody to tell; every call would only wait out the read timeout
        if joined.leave(ok) and not ok:
            joined.stop_job(self._stopped_by, self._preempted)

    def _left_while_joining(self, joined: JoinedRound | None) -> bool:
        """Gave up: a round that closed with it while ``next_round`` ran is left as by its running
        members (``stopping``); with no round before, the job stops. False: leave ``joined``."""
        if self._junk or self._liveness.store_problem() is not None:
            return joined is None
        after = -1 if joined is None else joined.membership.round
        placed = placed_in(self._board, after) if self._joining else None
        if placed is not None:  # (no beat may land after its LEFT; no last word after it)
            self._liveness.stop_beating()
            self._tell_last_word(withdrawn=True)
        elif joined is not None:
            return False
        tell_left_while_joining(self._board, placed, self._hostname, self._addr, self._stopped_by, self._preempted)  # fmt: skip
        return True

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._sweeper.wait()  # before the last node to leave deletes the run
            self._leave()
        except StoreUnavailable as exc:
            log.info("rendezvous: leaving without telling the other nodes: %s", exc)
        finally:
            self._liveness.stop()
            self._store.close()

    # -- internals -------------------------------------------------------------------------
    def _tell_last_word(self, withdrawn: bool = False) -> None:
        """Give ``on_last_word``'s listener this node's word now (none once it left on purpose)."""
        if self._heard is None:
            return
        reach = None if withdrawn else self._reach
        self._heard(None if reach is None else word(reach, self.run_id, self._node_id))

    def _leave(self) -> None:
        """Leave the run's store as ``departure`` says, if a round formed and the store is there."""
        if self._joined is None or self._liveness.store_problem() is not None:
            return
        membership, barrier = self._joined.membership, self._wires.barrier
        self._departure.leave(
            membership, self._joined.rank, self._done, lambda: barrier.once(membership)
        )
