"""A round whose every member is gone, closed by a node that waits for the next one.

A node that arrives while a round runs waits for the next round (a spare beyond MAX, or a
newcomer to a job below MAX: ``formation``), and only a member opens a restart round: the
one that finds a peer lost claims the restart and opens it. When every member goes at once
(each fenced under CPU starvation, all SIGKILLed with their workers) nobody is left to, and
the waiting nodes -- the agents started again among them -- used to wait for ever.

So while it waits, a node judges the running round's members by the rule their watchers use
for ``node_lost`` (``pulse``: a heartbeat counter unchanged for ``heartbeat_timeout`` on this
node's clock from its first look; on etcd a lapsed lease; the guardian's ``died``), along
the members in rank order up to the first one alive, as the ring watch does. When none is
alive and one at least is lost (the others left on purpose), it does what their watchers
would have done, each step a compare-and-set that any number of waiting nodes may race
through with one outcome:

1. settles each member's place (lost; left for one that left) and, where its own settling
   won, tells the round: the ``node_lost`` record is the root cause the job's report names;
2. claims the restart after the round (``Board.abandon``: the first claim decides for every
   node, so the budget pays once however many wait), within ``--max-restarts`` and unless
   a member had finished its workers, as a member's claim is;
3. opens the next round, which forms from the waiting nodes by the usual MIN/MAX rules; its
   membership carries the job's restart count and why the round before was abandoned
   (``round_abandoned`` in each node's event log). With no restart left every waiting node
   ends with the same error, and so does any started later under the run id.

Not a split brain: a member whose heartbeat is fresh (alive but slow) is not lost, and the
walk stops at it (one read per wake while the round runs); a read that fails knows nothing:
what was seen is forgotten, so a silence is timed afresh from when the store answers again.
A member judged lost has fenced itself by then (``fencing``: its own clock is quicker).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from phalanx.config import shown_run_id
from phalanx.errors import RendezvousError
from phalanx.rendezvous.api import restarts_left
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.lost import tell_lost
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.dynamic.pulse import UNREAD, Verdict, pulse_for
from phalanx.rendezvous.dynamic.records import parsed
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import Malformed, StoreUnavailable

log = logging.getLogger("phalanx")

Judge = Callable[[str], tuple[Verdict, str]]


def gone(node_ids: Sequence[str], judge: Judge) -> dict[int, tuple[Verdict, str]] | None:
    """Each member's verdict (by rank), when no member of the round is alive and one at least
    is lost; None otherwise. Judges in rank order and stops at the first member alive; one
    that looks quiet (not heard from lately, not yet lost) is no proof either way: the walk
    goes on past it, so the others' silences are timed from now too (pure but for
    ``judge``)."""
    verdicts: dict[int, tuple[Verdict, str]] = {}
    for rank, node_id in enumerate(node_ids):
        verdicts[rank] = judge(node_id)
        if verdicts[rank][0] is Verdict.ALIVE:
            return None
    kinds = {verdict for verdict, _ in verdicts.values()}
    return verdicts if Verdict.LOST in kinds and Verdict.QUIET not in kinds else None


class Abandoned:
    """The check a waiting node makes on every wake (``formation``'s wait for round t)."""

    def __init__(
        self,
        board: Board,
        settings: RendezvousSettings,
        max_restarts: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._b = board
        self._max_restarts = max_restarts
        self._clock = clock
        self._pulse = pulse_for(board, settings, clock)  # only its ``judge`` is used
        self._running: Membership | None = None  # the running round's members, read once
        # ``settle_lost``'s: (round, its settled count at the last look); the places of that
        # round found settled.
        self._stall: tuple[int, int] | None = None
        self._known: tuple[int, set[int]] = (-1, set())

    def ahead(self, t: int) -> str | None:
        """The heartbeat key ``check`` judges first while round t-1 runs (its first member),
        once its members are known (None: not yet), for the caller to read with its own
        reads in one round trip."""
        running = self._running
        if running is None or running.round != t - 1 or not running.node_ids:
            return None
        return self._b.keys.heartbeat(running.node_ids[0])

    def check(self, t: int, hostname: str, read: dict[str, bytes | None] | None = None) -> bool:
        """Whether round t is open now because round t-1 was found abandoned (this node, on
        ``hostname``, opened it, or another waiting node did). Raises ``RendezvousError``
        when it was and the job has no restart left. ``read``: heartbeat keys read already
        (``ahead``), by key; the others are read here."""
        try:
            running = self._members(t - 1)
            if running is None:
                return False
            now = self._clock()
            heard = dict(read or {})
            keys = self._b.keys

            def judge(node_id: str) -> tuple[Verdict, str]:
                return self._pulse.judge(node_id, now, heard.pop(keys.heartbeat(node_id), UNREAD))

            verdicts = gone(running.node_ids, judge)
            if verdicts is None:
                return False
            return self._abandon(running, verdicts, hostname)
        except Malformed:
            raise  # junk is final: the join ends on it, as on any other read
        except StoreUnavailable as exc:
            # Knows nothing: a silence seen before the failure is not counted past it.
            self._pulse.follow()
            log.info("rendezvous: could not judge the running round's members: %s", exc)
            return False

    def settle_lost(self, r: int, settled: int | None = None) -> None:
        """While restart round r+1 waits for round r's members to settle: settle each one
        still unsettled that is lost by its watchers' rule, and tell the round. Its watchers
        may all be gone or joining (a joining node's watch asks nothing of round r): members
        that fenced came back as new members and watch round r no more (the c10d soak, seed 4141: the store's host frozen 10 s fenced both survivors
        while a third member was SIGKILLed, and its place held the round for join_timeout).

        ``settled``: how many of round r's members have settled, as just read (None: read
        it here). Only a count that stood still since this node's last look is worth a walk
        over the members: while members still rejoin, the wait is theirs, and their watchers
        judge them (a walk then cost every waiting node a read per member, a thousand at
        1,024 nodes, each time it woke). A silence is timed from the walk's first look, so a
        lost member whose watchers are gone is found one look (a heartbeat interval) later."""
        if settled is None:
            settled = self._b.counter(self._b.keys.round(r, "settled"))
        if self._stall != (r, settled):
            self._stall = (r, settled)
            return
        try:
            running = self._members(r)
            if running is None:
                return
            self._known = self._known if self._known[0] == r else (r, set())
            known = self._known[1]  # settled places stay settled: each is read once
            unknown = [rank for rank in range(running.count) if rank not in known]
            fates = self._b.get_many([self._b.keys.fate(r, rank) for rank in unknown])
            now = self._clock()
            for rank, fate in zip(unknown, fates, strict=True):
                if fate is not None:
                    known.add(rank)  # rejoined, left, or found lost by another
                    continue
                verdict, why = self._pulse.judge(running.node_ids[rank], now)
                if verdict is Verdict.LOST and self._b.settle(r, rank, running.count, "lost"):
                    log.warning("rendezvous: %s", tell_lost(self._b, running, rank, why))
        except StoreUnavailable as exc:
            self._pulse.follow()  # knows nothing: a silence is timed afresh
            log.info("rendezvous: could not judge round %d's unsettled members: %s", r, exc)

    def _members(self, r: int) -> Membership | None:
        """Round r's members once it closed (not failed) and its membership is written."""
        if self._running is not None and self._running.round == r:
            return self._running
        decision = self._b.decision(r)
        if decision is None or decision.failed:
            return None
        key = self._b.keys.round(r, "members")
        body = self._b.get_json(key)
        if body is None or "fail" in body:
            return None
        self._running = parsed(key, body, Membership.from_json)
        self._pulse.follow()  # a round not seen before: its silences are timed from now
        return self._running

    def _abandon(
        self, running: Membership, verdicts: dict[int, tuple[Verdict, str]], hostname: str
    ) -> bool:
        r, b = running.round, self._b
        for rank, (verdict, why) in verdicts.items():
            fate = "lost" if verdict is Verdict.LOST else "left"
            if b.settle(r, rank, running.count, fate) and fate == "lost":
                log.warning("rendezvous: %s", tell_lost(b, running, rank, why))
        lost = sum(verdict is Verdict.LOST for verdict, _ in verdicts.values())
        rest = ", the others left" if lost < running.count else ""
        reason = (
            f"every member of round {r} is gone ({lost} of {running.count} lost{rest}; none "
            f"is left to restart the job), found by {hostname} while it waited to join"
        )
        within = restarts_left(running.restart_count, self._max_restarts) > 0
        finished = within and b.any_ok(r)
        restart, said = b.abandon(r, within and not finished, reason)
        if not restart:
            why = "a member had finished its workers" if finished else (
                f"no restart left (--max-restarts {self._max_restarts}, "
                f"{running.restart_count} spent)"
            )  # fmt: skip
            raise RendezvousError(
                f"rendezvous {shown_run_id(b.keys.run_id)}: the job cannot go on: "
                f"{said or reason}; {why}"
            )
        b.open_round(r + 1)
        log.warning(
            "rendezvous: %s: opening round %d as restart %d of %d",
            said or reason, r + 1, running.restart_count + 1, self._max_restarts,
        )  # fmt: skip
        return True
