"""Forming one round: join, agree when it closes and who is in, pick the master port.

Every node does O(1) store operations per round (the assembler reads the n arrivals):

1. **Join** round t: ``slot = add(joined)``, then write the arrival under ``node/<slot>``.
   A member of round t-1 (a restart) first opens round t, and after joining records its
   fate in t-1 as ``rejoined``.
2. **Close**: one compare-and-set on ``closed`` decides for everyone how many arrivals are in
   (slots 1..n) -- or that the round failed. The MAX-th arrival closes at once (unless a
   quorum of members decides, below). In round 0 an arrival with slot >= MIN closes after
   the last-call window unless someone did first. Later, nodes first wait until every
   member of round t-1 is accounted for (rejoined, lost -- judged by the waiting nodes too,
   whose watchers may be gone -- or left: a member still stopping its workers is waited
   for, not dropped); then the round closes at once when every survivor and every queued node
   (spare or newcomer) is in, after the last call otherwise -- but not while a queued node
   that still beats is missing (``queued``: a spare that hiccups when it is chosen is
   waited for until its heartbeat is ``heartbeat_timeout`` old, and at most
   ``heartbeat_timeout`` past the last call) -- and fails when fewer than MIN nodes are
   left, or (c10d) too few of round t-1's members (``majority``: no split brain).
3. **Membership** (``assembly``): slot 1 reads the n arrivals, assigns node ranks, writes
   ``members`` (a deterministic result, so any node can redo it if slot 1 died). Node rank 0
   picks a free port on its host and publishes ``master``.

A node that finds the round closed without it (late, or beyond MAX) queues for the next
round (its members see ``NODE_WAITING`` if it has room). A spare the job ends without leaves
with exit 0 (``NotNeeded``). One that finds every member of the running round gone opens
the next round itself (``abandoned``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from phalanx.config import shown_run_id
from phalanx.errors import Interrupted, NotNeeded, PhalanxError, Preempted, RendezvousError
from phalanx.rendezvous.dynamic.abandoned import Abandoned
from phalanx.rendezvous.dynamic.admission import check_admission
from phalanx.rendezvous.dynamic.assembly import master_of, members_of
from phalanx.rendezvous.dynamic.board import Board, Decision
from phalanx.rendezvous.dynamic.majority import close_restart, ended, expire_late, failed_over
from phalanx.rendezvous.dynamic.members import Arrival, Membership
from phalanx.rendezvous.dynamic.pulse import UNREAD, Unread
from phalanx.rendezvous.dynamic.queued import QueuedNodes, restart_close
from phalanx.rendezvous.dynamic.records import count_in, encode
from phalanx.rendezvous.dynamic.waiting import WaitingLine
from phalanx.rendezvous.dynamic.wake import look
from phalanx.rendezvous.settings import RendezvousSettings

# A store that outlives the job (etcd) keeps the run's state, so an id serves one job.
_SINGLE_USE = "a run id serves one job: give a new --rdzv-id to start another"


class RoundFormer:
    def __init__(
        self,
        board: Board,
        settings: RendezvousSettings,
        min_nodes: int,
        max_nodes: int,
        clock: Callable[[], float] = time.monotonic,
        worker_port: int | None = None,
        where: str = "",
        admit_mismatch: bool = False,
        arriving: Callable[[], None] = lambda: None,
        standing_by: Callable[[int, bool], None] = lambda t, waiting: None,
        majority: bool = False,
        max_restarts: int = 0,
        back: Callable[[int], None] = lambda t: None,
        idle: Callable[[Callable[[], bool]], None] = lambda needed: None,
    ) -> None:
        """``worker_port``: the workers' master port in every round (``phalanx.spawn``);
        None: node 0 picks a free port each round. ``where``: the store, as the waiting line
        names it. ``admit_mismatch``: join a running job whose code or arguments differ
        (``admission``; --allow-mismatch). ``standing_by(t, waiting)``: called whenever this
        node goes (back) to waiting for round t as no member of a running round (each time
        it loses the race for a place), and again on each turn of that wait (``waiting``);
        ``arriving``: after that, just before it takes a slot (``Fence.stand_down``,
        ``Fence.arrived``). ``majority``: the store may move (c10d): a restart round needs a
        quorum of the last round's members (``majority``). ``max_restarts``: the budget a
        waiting node spends when every member is gone (``abandoned``). ``back(t)``: called
        while restart round t waits; raises to leave this store (``goback``). ``idle(needed)``:
        on each turn of a wait as a spare (the job runs at MAX without this node), for work
        that no round waits for (``Peers.while_spare``); ``needed()``: the round it waits for
        opened (one read), to give that work up."""
        self._b, self._keys, self._s, self._clock = board, board.keys, settings, clock
        self._min, self._max = min_nodes, max_nodes
        self._worker_port = worker_port
        self._admit_mismatch = admit_mismatch
        self._arriving = arriving
        self._standing_by = standing_by
        self._majority, self._back, self._idle = majority, back, idle
        self._line = WaitingLine(board, min_nodes, max_nodes, clock=clock, where=where)
        self._queue = QueuedNodes(board, settings, clock)
        self._abandoned = Abandoned(board, settings, max_restarts, clock)
        self._was_spare = False  # this join waited as a spare (round t-1 ran at MAX)
        self._ran = False  # this node was a member of a round (ran workers) in this job

    def form(
        self, me: Arrival, prior: Membership | None, prior_rank: int | None
    ) -> tuple[Membership, int, tuple[str, int]]:
        """Join the next round (after ``prior``, if this node was in it) and block until it
        forms; return the membership, this node's rank and the master address/port. While it
        waits, the waiting line says who is there (``waiting``)."""
        try:
            return self._form(me, prior, prior_rank)
        finally:
            self._line.end()

    def _form(
        self, me: Arrival, prior: Membership | None, prior_rank: int | None
    ) -> tuple[Membership, int, tuple[str, int]]:
        deadline = self._clock() + self._s.join_timeout
        self._was_spare = False
        # A node that ran workers is never "not needed": the job's end is its to report.
        self._ran |= prior is not None
        rejoining = prior is not None and prior_rank is not None
        t = prior.round + 1 if prior is not None and rejoining else self._b.latest_round()
        queued: set[int] = set()
        while True:
            if rejoining:
                self._open(t)
            else:
                self._check_stopped()
                self._standing_by(t, False)  # no member of a running round while it waits
                t = self._first_undecided(t)
                if not self._admit_mismatch:
                    check_admission(self._b, t, me.fingerprint)
                if not self._b.is_open(t) and t not in queued:
                    self._queue.queue(t, me, self._max)  # round t-1 runs without us
                    queued.add(t)
                deadline = self._wait_open(t, deadline, me.hostname)
                self._arriving()
            slot = self._b.store.add(self._keys.round(t, "joined"), 1)
            if slot > self._max:  # full: queue for the next round (a member: here for it)
                self._rejoined(t, prior, prior_rank, rejoining)
                rejoining = False
                t += 1
                continue
            self._b.store.set(self._keys.node(t, slot), encode(me.to_json()))
            # Closed before settling (the last settle wakes all, who would each propose a close).
            full = self._b.close(t, Decision(count=self._max)) if self._full(t, slot) else None
            self._rejoined(t, prior, prior_rank, rejoining)
            decision = full or self._await_decision(t, slot, deadline)
            if decision.failed:
                raise self._ended(decision.failure)
            if slot > decision.count:  # closed without this node: queue for the next round
                rejoining = False
                t += 1
                continue
            port = self._worker_port
            members, master = members_of(self._b, self._s, t, decision.count, slot, prior, port)
            rank = members.node_ids.index(me.node_id)
            return members, rank, master_of(self._b, self._s, members, rank, port, master)

    # -- joining ---------------------------------------------------------------------------
    def _open(self, t: int) -> None:
        """A member of round t-1 opens round t (the job's stop and the newest round read in
        one round trip where the store can)."""
        stopped, latest = self._b.get_many([self._keys.stopped, self._keys.latest_round])
        if stopped is not None:
            self._check_stopped()
        self._b.open_round(t, latest, read=True)

    def _rejoined(self, t: int, prior: Membership | None, rank: int | None, back: bool) -> None:
        """A member of round t-1 (``prior``) is ``back``: its old place settles as rejoined,
        also when round t is full (it waits here for t+1): t closes once t-1 settled."""
        if back and prior is not None and rank is not None:
            self._b.settle(t - 1, rank, prior.count, "rejoined")

    def _check_stopped(self, stopped: tuple[str, bool] | Unread | None = UNREAD) -> None:
        """Raise if the job stopped (``stopped``: ``Board.stopped`` as read already)."""
        if isinstance(stopped, Unread):
            stopped = self._b.stopped()
        if stopped is None:
            return
        reason, finished = stopped
        if finished:  # the tombstone of a run that succeeded (its other keys may be gone)
            raise self._not_needed(self._b.latest_round() + 1)
        by_signal = self._b.stop_signal()
        if by_signal is not None:  # a stop or a preemption, not a failure: end as that node
            signum, preempted, where = by_signal
            if preempted:
                raise Preempted(signum, f"preempted on {where} ({reason})", where)
            raise Interrupted(signum, where)
        raise self._ended(
            f"rendezvous {shown_run_id(self._keys.run_id)}: the job stopped: {reason} ({_SINGLE_USE})",
            reason,
        )

    def _ended(self, failure: str, reason: str = "") -> PhalanxError:
        """The job ended without this node (``failure``: as a member would say it): a spare
        was not needed, whatever the job's outcome (its members report that)."""
        if self._was_spare:
            return NotNeeded(
                f"the job ended while this node waited as a spare ({reason or failure}): "
                "not needed, nothing to run"
            )
        return ended(failure, reason)  # out of the job: cut off from its members

    def _first_undecided(self, t: int) -> int:
        """The first round not yet closed (closed ones run, or ran, without this node)."""
        while (decision := self._b.decision(t)) is not None:
            if decision.failed:
                raise self._ended(decision.failure)
            t += 1
        return t

    def _wait_open(self, t: int, deadline: float, hostname: str) -> float:
        """Wait while round t-1 runs, until round t opens (by this node when it finds every
        member of round t-1 gone: ``abandoned``); give up if the job ends first.
        Past ``join_timeout`` a spare (round t-1 runs with MAX members: nothing is missing
        but this node's place) keeps waiting for the job's life; returns the join deadline
        for the rest of the round (the timeout again from now, for such a spare)."""
        key = self._keys.round(t, "open")
        if t == 0:
            return deadline  # round 0 is open from the start: nothing to read
        waited_past = False
        while not (seen := look(self._b, t, self._abandoned.ahead(t))).open:  # (one round trip)
            self._check_stopped(self._b.stopped_in(seen.stopped))
            spare = self._spare(t, seen.closed)
            self._was_spare |= spare and not self._ran
            if seen.all_ok:
                raise self._not_needed(t)
            if self._abandoned.check(t, hostname, seen.ahead):
                continue
            left = deadline - self._clock()
            if left <= 0 and spare:
                deadline = self._clock() + self._s.join_timeout
                left, waited_past = self._s.join_timeout, True
            if left <= 0:
                raise RendezvousError(
                    f"rendezvous {shown_run_id(self._keys.run_id)}: no place for this node within "
                    f"join_timeout={self._s.join_timeout:g}s: round {t - 1} is running and "
                    "no new round opened (set --rdzv-conf join_timeout=... to wait longer)"
                )
            self._line.check(t, deadline, queued=True, spare=spare, present=seen.joined)
            self._standing_by(t, True)  # (the round that runs, once its members are written)
            if spare:
                self._idle(lambda: self._b.is_open(t))
            self._b.store.wait([key], min(left, self._s.heartbeat_interval))
        # A spare that waited past the timeout gets the whole timeout for the round it joins.
        return self._clock() + self._s.join_timeout if waited_past else deadline

    def _spare(self, t: int, closed: bytes | None) -> bool:
        """Round t-1 runs with MAX members: this node waits as a spare (``closed``: round
        t-1's ``closed`` key as read)."""
        running = self._b.decision_in(t - 1, closed)
        return running is not None and not running.failed and running.count >= self._max

    def _not_needed(self, t: int) -> PhalanxError:
        """The job finished while this node waited for round t: a spare leaves with exit 0, and
        so does a member that lost its place (it used to end 1 in a job that succeeded)."""
        if self._was_spare or self._ran:
            return NotNeeded(
                f"the job finished while this node waited {'to rejoin' if self._ran else 'as a spare'} "
                f"(round {t - 1} ran with all its members): not needed, nothing to run"
            )
        return RendezvousError(
            f"rendezvous {shown_run_id(self._keys.run_id)}: the job finished while this node waited "
            f"to join ({_SINGLE_USE})"
        )

    # -- closing ---------------------------------------------------------------------------
    def _full(self, t: int, slot: int) -> bool:  # (a members' quorum is known once settled)
        return slot == self._max and not (self._majority and t > 0)

    def _await_decision(self, t: int, slot: int, deadline: float) -> Decision:
        if t > 0:
            return self._await_restart(t, deadline)
        # Round 0: MIN in, the last call; fewer, until the join deadline.
        until = self._clock() + self._s.last_call_timeout if slot >= self._min else deadline
        if (decided := self._wait_decided(t, min(until, deadline), None, deadline)) is not None:
            return decided
        return self._close_with(t, self._b.read_int(self._keys.round(t, "joined")))

    def _await_restart(self, t: int, deadline: float) -> Decision:
        """Round t > 0: wait for round t-1's members to settle, then close as
        ``restart_close`` says (checked again every heartbeat interval past the last call:
        a queued node that still beats is on its way)."""
        settled = self._keys.round(t - 1, "all_settled")
        if self._majority and failed_over(self._b, t - 1):  # members lost with its host
            expire_late(self._b, t - 1, self._s.heartbeat_timeout, self._clock, self._back)
        decided = self._wait_decided(t, deadline, settled, deadline, settling=True)
        if decided is not None:
            return decided
        if self._clock() >= deadline:
            why = f"members of round {t - 1} neither rejoined nor were found lost"
            return self._b.close(
                t, Decision(failure=f"{why} within join_timeout={self._s.join_timeout:g}s")
            )
        keys = self._keys  # (the reads below: one round trip where the store can)
        closed, gone, *counts = self._b.get_many(
            [keys.round(t - 1, "closed"), keys.round(t - 1, "gone"), *self._counted(t)]
        )
        previous = self._b.decision_in(t - 1, closed)
        survivors = (previous.count if previous else 0) - count_in(keys.round(t - 1, "gone"), gone)
        last_call = self._clock() + self._s.last_call_timeout
        # A queued node's beats come from a thread of their own: a node whose main thread
        # is stuck (a full stderr pipe, a slow run directory) beats but never joins. One
        # that beats joins within a heartbeat_timeout past the last call, or never will.
        patience = min(deadline, last_call + self._s.heartbeat_timeout)
        while True:
            now = self._clock()
            joined, queued = (count_in(k, v) for k, v in zip(self._counted(t), counts, strict=True))
            # Past patience nobody is waited for; before it, the judge's clock starts at
            # the first look (the spare's last beat was before it).
            live = self._queue.live(t, queued) if now < patience else 0
            over = now >= min(last_call, deadline)
            nodes = (self._min, self._max)
            if restart_close(joined, survivors, queued, live, nodes, over) is not None:
                return self._close_with(t, joined)
            until = last_call if now < last_call else now + self._s.heartbeat_interval
            if (decided := self._wait_decided(t, min(until, deadline), None, deadline)) is not None:
                return decided
            counts = self._b.get_many(self._counted(t))

    def _counted(self, t: int) -> list[str]:
        """Round t's arrivals and the nodes queued for it: the counters its close weighs."""
        return [self._keys.round(t, "joined"), self._keys.round(t, "waiting")]

    def _close_with(self, t: int, joined: int) -> Decision:
        """Close round t with the ``joined`` arrivals, or fail it below MIN (or the quorum)."""
        if t > 0 and self._majority:
            return close_restart(self._b, t, joined, (self._min, self._max))
        if joined >= self._min:
            return self._b.close(t, Decision(count=min(joined, self._max)))
        if t > 0:
            why = f"only {joined} node(s) are left after round {t - 1}"
        else:
            why = f"only {joined} node(s) joined within join_timeout={self._s.join_timeout:g}s"
        return self._b.close(t, Decision(failure=f"{why}; at least {self._min} needed"))

    def _wait_decided(
        self,
        t: int,
        until: float,
        key: str | None = None,
        deadline: float | None = None,
        *,
        settling: bool = False,
    ) -> Decision | None:
        """Wait until round t is decided (-> the decision), ``key`` exists or ``until`` (-> None).
        ``deadline``: the join timeout's, for the waiting line; ``settling``: what is awaited
        is round t-1's members each rejoining, leaving or being found lost (the line says so)."""
        # Each pass reads the decision, the job's stop and (``settling``) how many of round
        # t-1's members settled, in the round trip of the wait before it where the store can.
        settled = self._keys.round(t - 1, "settled")
        reads = [
            self._keys.round(t, "closed"),
            self._keys.stopped,
            *([settled] if settling else []),
        ]
        state = self._b.get_many(reads)
        while True:
            if (decision := self._b.decision_in(t, state[0])) is not None:
                return decision
            if state[1] is not None:
                self._check_stopped()
            self._back(t)
            left = until - self._clock()
            if left <= 0:
                return None
            self._line.check(t, until if deadline is None else deadline, settling=settling)
            if settling:  # round t-1's watchers may be gone (fenced, back as new members)
                self._abandoned.settle_lost(t - 1, count_in(settled, state[2]))
            woken, state = self._b.wait_get(
                [key or reads[0]], min(left, self._s.heartbeat_interval), reads
            )
            if woken and key:
                return self._b.decision_in(t, state[0])
