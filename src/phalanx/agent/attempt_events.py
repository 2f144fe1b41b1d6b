"""The events of one attempt, taken from what the agent already sees.

``AttemptEvents.see`` is one of the tick's watchers (``phalanx.tick``): on its first reading it
records the started workers, then each rank's progress counters at most every
``PROGRESS_EVERY`` seconds, and only when they moved -- but at once, at the tick that first
sees it, when a rank first moves in the attempt and when its step first reaches ``redo``
(the failed attempt's highest step), so that the recovery figures' "first progress" and
"back" are good to a tick, not to a sample. ``ended`` records one last reading of the
counters and every worker's exit, so the last step before a failure is exact.

Every ``progress`` event carries ``age``: the rank's counters changed after the agent's
previous reading, ``age`` seconds before the event (one tick, or longer while the agent's own
process was stopped). ``t - age`` is the earliest the move can have happened: the recovery
figures take it as the rank's last progress (``events.figures``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from phalanx.events.log import EventLog
from phalanx.plan import RoundPlan, WorkerPlan
from phalanx.rendezvous.api import JobEvent
from phalanx.supervisor.exits import WorkerExit
from phalanx.tick import Reading
from phalanx.worker import progress

# The hang analysis is read only after a hang (imported there): a type here.
if TYPE_CHECKING:
    from phalanx.hang.analysis import HangAnalysis

PROGRESS_EVERY = 2.0  # seconds between samples of one rank (a timeline's resolution)
_NOTHING = (0, progress.NO_STEP)  # the counters before a rank's first move


class AttemptEvents:
    def __init__(
        self, events: EventLog, plan: RoundPlan, round_: int, attempt: int, redo: int | None = None
    ) -> None:
        """``redo``: the last failed attempt's highest step on this node (None: none)."""
        self._events = events
        self._plan = plan
        self._round = round_
        self._attempt = attempt
        self._redo = redo
        self._started = False
        self._next_sample = 0.0
        self._last: dict[int, tuple[int, int]] = {}  # rank -> (beats, step) last emitted
        # rank -> (beats, step) at the last reading, and the reading before the one that
        # first saw them (when the rank last moved, at the earliest)
        self._seen: dict[int, tuple[tuple[int, int], float]] = {}
        # The last reading's time; at first the attempt's start: its workers' counters are
        # made afresh (zero) as they start, so no rank moved before this.
        self._read_at = time.monotonic()

    @property
    def peak(self) -> int | None:
        """The highest step any rank of this node reported in the attempt (None: none)."""
        steps = [step for _, step in self._last.values() if step != progress.NO_STEP]
        return max(steps) if steps else None

    def see(self, reading: Reading) -> bool:
        """A tick's reading (never stops the round)."""
        running = reading.running
        if not self._started:
            self._started = True
            self._emit_started([w.global_rank for w, _ in running], [p for _, p in running])
        self._track(reading)
        workers = [w for w, _ in running]
        if reading.at >= self._next_sample:
            self._next_sample = reading.at + PROGRESS_EVERY
        else:
            workers = [w for w in workers if self._news(reading.counters.get(w.global_rank), w)]
        self._sample(reading, workers)
        return False

    def ended(self, exits: Sequence[WorkerExit]) -> None:
        if not self._started:  # every worker ended before the first tick
            self._started = True
            self._emit_started([e.rank for e in exits], [e.pid for e in exits])
        reading = Reading.take(self._plan.workers)
        self._track(reading)
        self._sample(reading, self._plan.workers)
        for e in sorted(exits, key=lambda e: e.rank):
            self._events.emit(
                "worker_exit",
                round=self._round,
                attempt=self._attempt,
                rank=e.rank,
                local_rank=e.local_rank,
                pid=e.pid,
                returncode=e.returncode,
                signal=e.signal_name,
                failed=e.failed,
                stopped_by_phalanx=e.stopped_by_launcher,
                exited_at=e.time,
            )

    def hang_named(
        self, ranks: list[int], suspects: list[int], report: Path | None, bound: float
    ) -> None:
        """The hang watch named ``ranks`` (past ``bound`` seconds without progress); the
        job goes on (``phalanx.hang.watch``)."""
        self._events.emit(
            "hang",
            round=self._round,
            attempt=self._attempt,
            ranks=ranks,
            suspects=suspects,
            report=str(report) if report else None,
            action="named",
            bound=bound,
        )

    def hang_over(self, rank: int, seconds: float, bound: float) -> None:
        """A rank the hang watch had named moves again after ``seconds`` of silence."""
        self._events.emit(
            "hang_over",
            round=self._round,
            attempt=self._attempt,
            rank=rank,
            seconds=seconds,
            bound=bound,
        )

    def failed(self, failure: AttemptFailure, *, stop_began: float) -> None:
        """The attempt failed and every local worker has exited (``emit_failure``)."""
        emit_failure(self._events, self._round, self._attempt, failure, stop_began=stop_began)

    def _emit_started(self, ranks: list[int], pids: list[int]) -> None:
        self._events.emit(
            "workers_started", round=self._round, attempt=self._attempt, ranks=ranks, pids=pids
        )

    def _track(self, reading: Reading) -> None:
        """Note, per rank, when its counters last changed: after the previous reading."""
        before = min(self._read_at, reading.at)
        for rank, counters in reading.counters.items():
            seen = self._seen.get(rank)
            if counters != (seen[0] if seen is not None else _NOTHING):
                self._seen[rank] = (counters, before)
        self._read_at = reading.at

    def _news(self, counters: tuple[int, int] | None, worker: WorkerPlan) -> bool:
        """Whether ``counters`` are said at once: the rank's first move in the attempt, or
        its step reaching ``redo`` (where the failed attempt was) for the first time."""
        last = self._last.get(worker.global_rank)
        if counters is None or counters == (last or _NOTHING):
            return False
        if last is None:
            return True
        redo = self._redo
        return redo is not None and counters[1] >= redo > last[1]

    def _sample(self, reading: Reading, workers: Sequence[WorkerPlan]) -> None:
        for worker in workers:
            counters = reading.counters.get(worker.global_rank)
            if counters is None or counters == self._last.get(worker.global_rank, _NOTHING):
                continue
            self._last[worker.global_rank] = counters
            beats, step = counters
            seen = self._seen.get(worker.global_rank)
            moved = seen[1] if seen is not None and seen[0] == counters else reading.at
            self._events.emit(
                "progress",
                round=self._round,
                rank=worker.global_rank,
                step=None if step == progress.NO_STEP else step,
                beats=beats,
                age=round(max(0.0, reading.at - moved), 3),
            )


def emit_failure(
    events: EventLog, round_: int, attempt: int, failure: AttemptFailure, *, stop_began: float
) -> None:
    """Attempt ``attempt`` (round ``round_``) failed and every local worker has exited (none
    started: a round that ended before its workers did): the hang found here (if any), the
    failure, and how long the stop took since it was acted on (``stop_began``; 0.0: now)."""
    stopped_at = events.now()
    detected_at = stop_began or stopped_at
    hang = failure.hang
    failed_at = failure.failed_at
    if hang is not None:
        stalled = [r.rank for r in hang.ranks if hang.timeout and r.idle >= hang.timeout]
        events.emit(
            "hang",
            round=round_,
            attempt=attempt,
            ranks=stalled or [hang.culprit.rank],
            suspects=[s.rank for s in hang.suspects],
            report=str(failure.hang_report) if failure.hang_report else None,
            action="failed",
            bound=hang.timeout or None,
        )
        failed_at = detected_at - hang.culprit.idle  # when its progress last moved
    events.emit(
        "failure",
        round=round_,
        attempt=attempt,
        rank=failure.rank,
        failed_node=failure.failed_node,
        failure_kind=failure.kind,
        reason=failure.reason,
        exit_code=failure.exit_code,
        local=failure.local,
        failed_at=failed_at,
        detected_at=detected_at,
    )
    events.emit(
        "stopped",
        round=round_,
        attempt=attempt,
        seconds=round(max(0.0, stopped_at - detected_at), 3),
    )


@dataclass(frozen=True)
class AttemptFailure:
    """Why an attempt failed, as this node knows it: its own root cause (``local``) or the
    peer event that stopped it."""

    local: bool  # this node's own root cause
    rank: int | None
    failed_node: int | None
    kind: str | None
    reason: str
    exit_code: int | None
    failed_at: float | None  # wall clock of the failure itself, when known
    hang: HangAnalysis | None = None
    hang_report: Path | None = None

    @classmethod
    def of_cause(
        cls, cause: WorkerExit, hang: HangAnalysis | None, report: Path | None
    ) -> AttemptFailure:
        return cls(
            local=True,
            rank=cause.rank,
            failed_node=cause.node_rank,
            kind=cause.kind or None,
            reason=cause.reason or cause.describe_exit(),
            exit_code=cause.exit_code,
            failed_at=cause.time,
            hang=hang,
            hang_report=report,
        )

    @classmethod
    def of_event(cls, event: JobEvent | None, reason: str) -> AttemptFailure:
        peer = event.failure if event is not None else {}
        rank, when = peer.get("rank"), peer.get("time")
        return cls(
            local=False,
            rank=rank if isinstance(rank, int) else None,
            failed_node=event.node_rank if event is not None else None,
            kind=str(peer.get("kind") or (event.kind.value if event is not None else "")) or None,
            reason=reason,
            exit_code=None,
            failed_at=float(when) if isinstance(when, (int, float)) else None,
        )
