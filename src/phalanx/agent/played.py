"""A round that ended, as the steps of the agent's loop after it read it (``agent.loop``):
``Played``, a round whose workers ran and ended; ``Failed``, a round that ended without
success, whether its workers ran (``Played.failed``) or the round ended before they started."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from phalanx.agent.attempt_events import AttemptEvents
from phalanx.agent.crashloop import ProgressMark
from phalanx.hang.watch import RoundWatch
from phalanx.plan import RoundPlan
from phalanx.rendezvous.api import EventKind, JobEvent, RendezvousResult, Round
from phalanx.report.oom import OomProbe
from phalanx.supervisor.exits import WorkerExit
from phalanx.supervisor.group import Outcome, RoundResult

# The hang analysis is read only after a hang (imported there): a type here.
if TYPE_CHECKING:
    from phalanx.hang.analysis import HangAnalysis


@dataclass(frozen=True)
class Failed:
    """A round that ended without success: what the steps after a failure read."""

    at: Round  # the round joined: its facts and its calls
    exits: list[WorkerExit]  # this node's (none: the round ended before they started)
    event: JobEvent | None  # what ended the round, when not this node's workers
    hang: HangAnalysis | None  # found here, or where this node's ranks were at a peer's
    progressed: Callable[[], bool]  # this node's evidence, read when the round is judged

    @property
    def kind(self) -> EventKind | None:
        return self.event.kind if self.event is not None else None


@dataclass(frozen=True)
class Played:
    """A round whose workers ended: what the steps after it read."""

    at: Round  # the round joined: its facts (``joined``) and its calls
    plan: RoundPlan
    result: RoundResult
    exits: list[WorkerExit]  # this node's, with its node rank
    watch: RoundWatch
    probe: OomProbe
    mark: ProgressMark
    attempt: AttemptEvents

    @property
    def joined(self) -> RendezvousResult:
        return self.at.result

    def failed(self) -> Failed:
        """The round as a failed one: its progress read from the mark taken at its start."""
        mark, plan, watch = self.mark, self.plan, self.watch
        return Failed(
            self.at, self.exits, self.result.event, watch.hang or watch.peer_hang,
            lambda: mark.progressed(plan),
        )  # fmt: skip


def ended_by_preemption(result: RoundResult) -> bool:
    """Whether a round that was preempted ended as a preemption (exit 75): its workers
    ended or were stopped by the deadline, or a peer went away meanwhile (stopped by the
    scheduler before the deadline, or its store with it). A worker that failed, here or on
    a peer (``PEER_FAILED``), is the job's failure."""
    if result.outcome is Outcome.PREEMPTED:
        return True
    event = result.event
    return result.outcome is Outcome.REMOTE and (
        event is None or event.kind is not EventKind.PEER_FAILED
    )
