"""What watches one round's workers, as the agent's loop (``agent.loop.Rounds``) sets it up
before they start: the hang watch (``RoundWatch``), the watchers of each tick (the attempt's
events, the status, the hang watch, the stragglers: ``tick.Watchers``), the preemption watch,
and the rendezvous' poll that the supervisor calls each tick."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from phalanx import exclusion
from phalanx.agent import pace
from phalanx.agent.attempt_events import AttemptEvents
from phalanx.config import LaunchConfig
from phalanx.events.log import EventLog
from phalanx.hang.watch import RoundWatch
from phalanx.plan import RoundPlan
from phalanx.rendezvous.api import JobEvent, RendezvousHandler, Round
from phalanx.status import StatusService
from phalanx.stragglers.watch import StragglerWatch
from phalanx.supervisor import laststep
from phalanx.supervisor.group import OnTick
from phalanx.supervisor.preempt import Preemption, PreemptWatch
from phalanx.supervisor.signals import SignalWatcher
from phalanx.tick import Watchers

if TYPE_CHECKING:  # the job-wide stacks of several nodes: imported where a round has them
    from phalanx.hang.jobstacks import JobStacks


class Watching:
    """The watchers of each round of one agent run."""

    def __init__(
        self,
        config: LaunchConfig,
        rendezvous: RendezvousHandler,
        signals: SignalWatcher,
        run_dir: Path,
        status: StatusService,
        events: EventLog,
    ) -> None:
        self.config = config
        self.rdzv = rendezvous
        self.signals = signals
        self.run_dir = run_dir
        self.status = status
        self.events = events

    def round_watch(self, plan: RoundPlan, at: Round, attempt: AttemptEvents) -> RoundWatch:
        """The round's hang watch (and stacks on request)."""
        return RoundWatch(
            plan,
            stall_timeout=self.config.checks.stall_timeout,
            requests=self.signals if self.signals.stacks_active else None,
            check_every=pace.check_every(self.config),
            job=self._job_stacks(at),
            hang_watch=pace.hang_watch(self.config),
            events=attempt,
            stopping=laststep.notify,
        )

    def tick(
        self, plan: RoundPlan, at: Round, attempt: AttemptEvents, watch: RoundWatch
    ) -> tuple[OnTick, StragglerWatch]:
        """What the supervisor calls each tick of the round: one reading of every rank's
        counters, seen by the attempt's events and the status writer (every tick), then the
        hang watch and the straggler watch (either may stop the round)."""
        config, joined, exchanges = self.config, at.result, at.exchanges()
        self.status.begin(plan, joined, exchanges.status if exchanges is not None else None)
        checks = exchanges.check if exchanges is not None else None

        def exclude(reason: str) -> str:
            here = exclusion.this_node(config.rendezvous.local_addr)
            exclusion.record(config.recovery.exclude_file, self.run_dir, here, reason)
            return str(here)

        slow = StragglerWatch(config.checks.stragglers, joined, checks, self.events, exclude)
        return Watchers(plan.workers, [attempt, self.status, watch, slow]), slow

    def preempt(self, at: Round) -> PreemptWatch:
        return PreemptWatch(
            self.config.recovery.preempt_grace,
            at.report_preemption,
            at.result.node_rank,
            on_start=self._preempt_event,
        )

    def poll(self, watch: RoundWatch, heard: JobEvent | None) -> Callable[[], JobEvent | None]:
        """The rendezvous' poll as the supervisor calls it, through the hang watch: first
        ``heard``, the event taken before the workers started that did not end the round
        (a node waiting to join: acted on at the first tick, as before)."""
        held = [heard] if heard is not None else []
        return lambda: watch.hear(held.pop() if held else self.rdzv.poll())

    def _preempt_event(self, preemption: Preemption) -> None:
        deadline = preemption.time + preemption.grace  # the first node's wall clock
        self.events.emit("preempt", signal=preemption.signal, deadline=deadline)

    def _job_stacks(self, at: Round) -> JobStacks | None:
        exchanges = at.exchanges()
        if exchanges is None or at.result.num_nodes == 1:
            return None
        from phalanx.hang.jobstacks import JobStacks

        return JobStacks(exchanges.stacks, at.result, self.run_dir)
