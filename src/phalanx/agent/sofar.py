"""What an agent run knows so far, shared by its loop (``agent.loop.Rounds``, which writes it)
and its ends (``agent.endings``, ``agent.between``, which read it): the attempt counts, the
nodes the last node check named, and the last failed round, kept until the next forms."""

from __future__ import annotations

from dataclasses import dataclass, field

from phalanx.hang.analysis import HangAnalysis
from phalanx.rendezvous.api import JobEvent, RendezvousResult
from phalanx.supervisor.exits import WorkerExit


@dataclass(frozen=True)
class SoFar:
    """A failed round, kept until the next forms: the report if the job ends before."""

    joined: RendezvousResult
    exits: list[WorkerExit]
    event: JobEvent | None
    hang: HangAnalysis | None
    records: list[dict[str, object]]


@dataclass
class Tally:
    """The run's counts and memory so far."""

    attempts: int = 0
    restart_count: int = 0  # the current attempt's, as its directory is named: attempt_<n>
    # The last failed round: its report if the job ends before the next forms.
    failure: SoFar | None = None
    # The nodes the last node check named (``agent.checking``), a line each.
    checked: list[str] = field(default_factory=list)
