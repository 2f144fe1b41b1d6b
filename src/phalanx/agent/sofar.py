"""What an agent run knows so far, as one value: the loop (``agent.loop.Rounds``) makes a
new one after each step, and its ends (``agent.endings``, ``agent.between``) read the one
they are given. The attempt counts, the nodes the last node check named, the restarts and
re-forms said so far, and the last failed round, kept until the next forms."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from phalanx.rendezvous.api import JobEvent, RendezvousResult
from phalanx.supervisor.exits import WorkerExit

# The hang analysis is read only after a hang (imported there): a type here.
if TYPE_CHECKING:
    from phalanx.hang.analysis import HangAnalysis


@dataclass(frozen=True)
class SoFar:
    """A failed round, kept until the next forms: the report if the job ends before."""

    joined: RendezvousResult
    exits: list[WorkerExit]
    event: JobEvent | None
    hang: HangAnalysis | None
    records: list[dict[str, object]]


@dataclass(frozen=True)
class RunState:
    """The run between two steps of its loop."""

    attempts: int = 0  # rounds joined (each an attempt directory's)
    # The last failed round: its report if the job ends before the next forms.
    failure: SoFar | None = None
    # The nodes the last node check named (``agent.checking``), a line each.
    checked: tuple[str, ...] = ()
    reforms: int = 0  # rounds re-formed for a joining node (no restart spent)
    restarting: bool = False  # a restart claimed: said once its round forms
    redo: int | None = None  # the last attempt's highest step here (``AttemptEvents``)
