"""Where a run's rendezvous lives in the store: every key under ``phalanx/rdzv/<run id>/``.

Job-wide keys:  ``round`` (the newest opened round), ``stopped`` (someone gave up for good),
``epoch`` (how many times the store moved to a successor: ``failover``), ``confirmed``
(a round formed on this successor's store: ``majority``), ``moved`` (left by the job in a
fresh store at the lost store's place: where the job's store went, ``backends.signpost``),
``failures`` + ``fail/<i>`` (the failure log) + ``fail_from`` (its first entry not yet
swept), ``sweep_from`` (the oldest round not yet swept), ``hb/<node id>`` (liveness: a heartbeat counter, or a key bound to the node's lease;
see ``pulse``).
Per round r, under ``r<r>/``: ``open``, ``joined`` (arrival counter), ``node/<slot>`` (an
arrival's details), ``waiting`` (nodes queued for this round while the previous one ran) + ``queued/<n>`` (the
node id of each, whose heartbeat a restart round judges: ``queued``),
``closed`` (the decision: how many arrivals are in, or why the round failed), ``members``,
``failover`` (re-published on a successor's store: the next round needs a strict majority),
``master``, ``fate/<rank>`` (how a member left the round: rejoined the next, lost, left),
``settled``/``gone``/``lost``/``all_settled`` (counting those fates), ``events`` + ``ev/<i>`` (the
event log),
``claim`` (the restart decision), ``judged``/``progressed`` (members that judged the failed
round, and those of them that saw progress during it) + ``verdict`` (the job's verdict on
it, see ``judge``), ``ok``/``all_ok`` (members done successfully),
``departed``/``all_departed`` (members that saw ``all_ok`` and stopped using the store),
``preempted`` (the first preemption notice of the round), ``stack_requests`` (how many job-wide stacks requests were made) + ``stacks/<n>/<rank>``
(node ``rank``'s answer to request ``n``; the requester deletes it once read), and the
same for status requests: ``status_requests`` + ``status/<n>/<rank>``; ``check/<phase>/<rank>``
(node ``rank``'s node-check record of that phase, read by every node: ``phalanx.nodecheck``;
and its rates, phase ``rates``: ``phalanx.stragglers``).

Nothing is kept for ever: ``sweep`` deletes a round's keys two rounds later, and on a store
that outlives the job (etcd) the last node to leave deletes all but ``stopped``, which stays
as the run's tombstone (see ``handler``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from phalanx.errors import UsageError

_RUN_ID = re.compile(r"^[A-Za-z0-9._:@+=-]+$")


def check_run_id(run_id: str) -> str | None:
    """A problem with ``run_id`` (None if fine). ``/`` would let one run's keys nest in another's."""
    if not _RUN_ID.match(run_id):
        return (
            f"--rdzv-id {run_id!r}: expected letters, digits and . _ : @ + = - "
            "(no spaces or slashes)"
        )
    return None


@dataclass(frozen=True)
class Keys:
    run_id: str

    def __post_init__(self) -> None:
        problem = check_run_id(self.run_id)
        if problem:
            raise UsageError(problem)

    @property
    def prefix(self) -> str:
        return f"phalanx/rdzv/{self.run_id}/"

    # -- job-wide --------------------------------------------------------------------------
    @property
    def latest_round(self) -> str:
        return self.prefix + "round"

    @property
    def stopped(self) -> str:
        return self.prefix + "stopped"

    @property
    def epoch(self) -> str:
        return self.prefix + "epoch"

    @property
    def confirmed(self) -> str:
        return self.prefix + "confirmed"

    @property
    def moved(self) -> str:
        return self.prefix + "moved"

    @property
    def sweep_from(self) -> str:
        return self.prefix + "sweep_from"

    @property
    def failures_from(self) -> str:
        return self.prefix + "fail_from"

    @property
    def failure_count(self) -> str:
        return self.prefix + "failures"

    def failure(self, index: int) -> str:
        return f"{self.prefix}fail/{index}"

    def heartbeat(self, node_id: str) -> str:
        return f"{self.prefix}hb/{node_id}"

    # -- per round -------------------------------------------------------------------------
    def round(self, r: int, name: str) -> str:
        return f"{self.prefix}r{r}/{name}"

    def node(self, r: int, slot: int) -> str:
        return self.round(r, f"node/{slot}")

    def queued(self, r: int, place: int) -> str:
        return self.round(r, f"queued/{place}")

    def fate(self, r: int, rank: int) -> str:
        return self.round(r, f"fate/{rank}")

    def event(self, r: int, index: int) -> str:
        return self.round(r, f"ev/{index}")

    def stacks(self, r: int, request: int, rank: int) -> str:
        return self.round(r, f"stacks/{request}/{rank}")

    def status(self, r: int, request: int, rank: int) -> str:
        return self.round(r, f"status/{request}/{rank}")

    def check(self, r: int, phase: str, rank: int) -> str:
        return self.round(r, f"check/{phase}/{rank}")

    # Every phase posted under ``check/``, one record per member each: the node check's
    # (``phalanx.nodecheck``) and the straggler watch's rates (``stragglers.watch.PHASE``,
    # posted in every round of several nodes: left out, they outlived their rounds).
    CHECK_PHASES = ("ready", "hello", "result", "rates")

    # Every fixed name a round may hold (the numbered ones are listed by ``round_keys``).
    ROUND_NAMES = (
        "open", "joined", "waiting", "closed", "members", "master", "settled", "gone", "lost",
        "all_settled", "events", "claim", "ok", "all_ok", "departed", "all_departed",
        "stack_requests", "judged", "progressed", "verdict", "preempted", "status_requests",
        "failover",
    )  # fmt: skip

    def round_keys(
        self,
        r: int,
        *,
        slots: int,
        members: int,
        events: int,
        requests: int,
        status_requests: int = 0,
        queued: int = 0,
    ) -> Iterator[str]:
        """Every key round ``r`` can hold, given its counters: ``slots`` arrivals, ``members``
        fates, ``events`` log entries, ``requests`` stacks requests and ``status_requests``
        status requests (one answer per member each), ``queued`` nodes queued for it."""
        for name in self.ROUND_NAMES:
            yield self.round(r, name)
        for slot in range(1, slots + 1):
            yield self.node(r, slot)
        for place in range(1, queued + 1):
            yield self.queued(r, place)
        for rank in range(members):
            yield self.fate(r, rank)
            for phase in self.CHECK_PHASES:
                yield self.check(r, phase, rank)
        for index in range(1, events + 1):
            yield self.event(r, index)
        for request in range(1, requests + 1):
            for rank in range(members):
                yield self.stacks(r, request, rank)
        for request in range(1, status_requests + 1):
            for rank in range(members):
                yield self.status(r, request, rank)
