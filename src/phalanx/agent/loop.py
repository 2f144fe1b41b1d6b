"""The restart loop of one agent run (its ends, and their reports, are ``agent.endings``).

About 370 lines on purpose: one round's steps (join, check, supervise, judge, restart or
end) read in order here; what they call lives in ``between``, ``endings`` and ``policy``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from phalanx import exclusion
from phalanx.agent.attempt_events import AttemptEvents, AttemptFailure
from phalanx.agent.between import Between
from phalanx.agent.checking import (
    CheckedNodes,
    SaidArgs,
    check_same_code,
    excludes_others,
    node_check,
)
from phalanx.agent.crashloop import ProgressMark, failure_signature
from phalanx.agent.describe import describe_event
from phalanx.agent.policy import Step, decide, judged
from phalanx.agent.stopped import asked_to_stop
from phalanx.config import LaunchConfig
from phalanx.errors import Interrupted, RendezvousError
from phalanx.hang.jobstacks import JobStacks
from phalanx.hang.watch import RoundWatch
from phalanx.plan import RoundPlan, build_plan
from phalanx.rendezvous.api import (
    EventKind,
    JobEvent,
    RendezvousHandler,
    RendezvousResult,
    RoundVerdict,
)
from phalanx.report.exits import root_cause
from phalanx.report.job import record_exits
from phalanx.report.oom import OomProbe
from phalanx.resources.limits import StartFailed
from phalanx.status import StatusService
from phalanx.stragglers.watch import StragglerWatch
from phalanx.supervisor.exits import WorkerExit
from phalanx.supervisor.group import OnTick, Outcome, RoundResult, Supervisor
from phalanx.supervisor.preempt import Preemption, PreemptWatch
from phalanx.supervisor.signals import SignalWatcher
from phalanx.tick import Watchers

QUIET_TICK = 1.0  # seconds between ticks with nothing to poll and no stall timeout
log = logging.getLogger("phalanx")


class Rounds:
    """The restart loop of one agent run, and the job-wide failure report at its end.

    Budget policy (see ``rendezvous.api``): a worker failure here or on a peer, and a lost
    node, spend a restart (``claim_restart``, job-wide); a node waiting to join (elastic
    scale-up) re-forms the round without spending one; a peer that gave up or a lost store
    ends the job. Before a restart, the job judges the round (``judge_round``, with this
    node's evidence from ``crashloop``): the same failure as the previous one with no
    progress anywhere is a crash loop, on every node at once.
    """

    def __init__(
        self,
        config: LaunchConfig,
        rendezvous: RendezvousHandler,
        supervisor: Supervisor,
        signals: SignalWatcher,
        run_dir: Path,
        base_env: Mapping[str, str],
        status: StatusService,
        between: Between,
    ) -> None:
        """``between``: the run's ends (its ``ends``: after a round; itself: between rounds),
        which read the ``tally`` this loop keeps."""
        self.config = config
        self.status = status
        self.rdzv = rendezvous
        self.supervisor = supervisor
        self.signals = signals
        self.run_dir = run_dir
        self.base_env = base_env
        self.between = between
        self.ends = between.ends
        self.tally = between.tally
        self.events = self.ends.events
        self.reforms = 0  # rounds re-formed for a joining node (no restart spent)
        self._restart = False  # a restart claimed: said once its round forms
        self.checked = CheckedNodes()  # the last round's agents: a restart's check not repeated
        self.said_args = SaidArgs()  # per-node script arguments: said once while they hold
        self._exclude = exclusion.ExcludeAfter(config, run_dir, self.events)  # --exclude-after
        self.peers = rendezvous.peers()  # None: a single node
        if self.peers is not None:  # a peer's event acted on at once, not at a tick
            self.peers.on_event(supervisor.wake)

    def _round_tick(
        self, plan: RoundPlan, joined: RendezvousResult, attempt: AttemptEvents, watch: RoundWatch
    ) -> tuple[OnTick, StragglerWatch]:
        """What the supervisor calls each tick of the round: one reading of every rank's
        counters, seen by the attempt's events and the status writer (every tick), then the
        hang watch and the straggler watch (either may stop the round)."""
        peers, config = self.peers, self.config
        self.status.begin(plan, joined, peers.status_exchange() if peers is not None else None)
        checks = peers.node_check() if peers is not None else None

        def exclude(reason: str) -> str:
            here = exclusion.this_node(config.rendezvous.local_addr)
            exclusion.record(config.recovery.exclude_file, self.run_dir, here, reason)
            return str(here)

        slow = StragglerWatch(config.checks.stragglers, joined, checks, self.events, exclude)
        return Watchers(plan.workers, [attempt, self.status, watch, slow]), slow

    def run(self) -> int:
        while True:
            joined = self._next_round()
            self._say_restart(joined)
            plan = build_plan(self.config, joined, self.run_dir, self.base_env)
            mark = ProgressMark.take(plan)
            self.tally.attempts += 1
            self.tally.restart_count = joined.restart_count
            attempt = AttemptEvents(self.events, plan, joined.round, self.tally.attempts)
            watch = RoundWatch(
                plan,
                stall_timeout=self.config.checks.stall_timeout,
                requests=self.signals if self.signals.stacks_active else None,
                check_every=self._check_every(),
                job=self._job_stacks(joined),
            )
            probe = OomProbe()
            tick, slow = self._round_tick(plan, joined, attempt, watch)
            preempt = self._preempt_watch(joined)
            result = self._supervise(plan, watch, tick, preempt)
            attempt.ended(result.exits)
            slow.leave()  # named a straggler under --straggler-action exclude: leaves the job
            exits = [replace(e, node_rank=joined.node_rank) for e in result.exits]
            if result.preemption is not None and _ended_by_preemption(result):
                self.ends.preempted(joined, plan, exits, result.preemption, result.event)
            if result.outcome is Outcome.SUCCEEDED:
                return self.ends.succeeded(joined, plan, exits)
            stop = asked_to_stop(result, self.between.stop_heard())
            if stop is not None:  # here or on another node: the job stops, with no failure
                self.ends.interrupted(joined, exits, *stop)
            exits, cause = self.ends.record_failure(exits, result.event, watch, probe)
            event = result.event.kind if result.event is not None else None
            if cause is not None or event is not EventKind.NODE_WAITING:  # a scale-up is no failure
                self.between.keep_failure(
                    joined, exits, result.event, watch.hang or watch.peer_hang
                )
                attempt.failed(
                    self._failure_events(cause, result.event, watch),
                    stop_began=self.supervisor.stop_began,
                    stall_timeout=self.config.checks.stall_timeout,
                )
            if result.preemption is not None:  # a failure during the grace: no restart
                self.ends.fail(joined, exits, result.event, watch.hang, None, crash_loop=False)
            if event is EventKind.STORE_LOST and cause is None and self._rejoined(joined):
                continue  # back as a new member: the others spent the restart for it
            step, verdict = self._next_step(joined, cause is not None, event, mark, plan)
            if step is not Step.REFORM:
                self._exclude.after_round(
                    self.rdzv.failures, joined, cause is not None, leave=step is Step.RESTART
                )
            if step is Step.REFORM:
                self.reforms += 1
                self.events.emit("reform", round=joined.round, reason="a node is waiting to join")
                continue  # a scale-up: re-form the round, no restart spent
            if step is Step.RESTART and self._restarted(joined):
                continue
            crash_loop = step is Step.CRASH_LOOP
            hang = watch.hang or watch.peer_hang
            self.ends.fail(joined, exits, result.event, hang, verdict, crash_loop=crash_loop)

    def _restarted(self, joined: RendezvousResult) -> bool:
        """Claim a restart of the job's budget after ``joined``'s round (the first claim of
        any node decides for all); said in the log once the next round forms."""
        if not self._claim_restart():
            return False
        self._restart = True
        self.events.emit(
            "restart",
            restart=joined.restart_count + 1,  # the job's count (re-forms are not)
            max_restarts=self.config.recovery.max_restarts,
            round=joined.round,
        )
        return True

    def _say_restart(self, joined: RendezvousResult) -> None:
        """Say the restart claimed after the last round, now that its round has formed: the
        job's count of restarts (the rendezvous's), and the re-forms for joining nodes apart."""
        if self._restart:
            reforms = f"; {self.reforms} re-form(s) for joining nodes" if self.reforms else ""
            log.warning(
                "restarting the worker group (restart %d of %d%s)",
                joined.restart_count, self.config.recovery.max_restarts, reforms,
            )  # fmt: skip
            self._restart = False

    def _supervise(
        self, plan: RoundPlan, watch: RoundWatch, tick: OnTick, preempt: PreemptWatch
    ) -> RoundResult:
        try:
            return self.supervisor.run(
                plan, self.signals, self._poll(watch), tick, preempt, self._tick_every()
            )
        except StartFailed as exc:  # a limit reached: no round without every worker
            self.between.cut_short(exc, str(exc))

    def _next_round(self) -> RendezvousResult:
        """Join the next round; a signal meanwhile ends the wait at once, and the other nodes
        are told this node left (the job stops: it cannot form without it)."""
        self.events.emit("rdzv_start", attempt=self.tally.attempts + 1)
        began = time.monotonic()
        try:
            with self.signals.raising():
                joined = self.rdzv.next_round(self.config.workers.nproc_per_node)
        except Interrupted as exc:  # a signal here, or (``where``) the job stopped by one elsewhere
            self.between.stopped_waiting(exc, "this node, in the rendezvous")
        except RendezvousError as exc:  # a node or the store lost, a timeout: no round
            self.between.cut_short(exc, self._no_round(exc))
        self.events.node = joined.node_rank
        self.events.emit(
            "rdzv_done",
            round=joined.round,
            attempt=self.tally.attempts + 1,
            num_nodes=joined.num_nodes,
            world_size=joined.world_size,
            members=[n.hostname for n in sorted(joined.nodes, key=lambda n: n.node_rank)],
            restart_count=joined.restart_count,
            seconds=round(time.monotonic() - began, 3),
        )
        check_same_code(self.config, self.rdzv, joined, self.events, self.said_args)
        verdict = node_check(
            self.config, self.rdzv, joined, self.run_dir, self.events, self.checked
        )
        if verdict is not None:
            self.tally.checked = [n.line for n in verdict.named]  # the report's, the newest round's
            if excludes_others(self.config, verdict):  # they leave: form a round without them
                self.events.emit("reform", round=joined.round, reason="the node check excluded a node")  # fmt: skip
                return self._next_round()
        if joined.num_nodes > 1 or self.tally.attempts == 0:
            # A spawn owner is one process per node that starts the node's ranks itself.
            owner = (
                " (ranks; one spawn-owner process per node starts them)"
                if self.config.workers.spawn_owner
                else ""
            )
            log.info(
                "round %d: node %d of %d, world size %d%s, master %s:%d",
                joined.round, joined.node_rank, joined.num_nodes, joined.world_size, owner,
                joined.master_addr, joined.master_port,
            )  # fmt: skip
        return joined

    def _failure_events(
        self, cause: WorkerExit | None, event: JobEvent | None, watch: RoundWatch
    ) -> AttemptFailure:
        """The failure to record: the job's root cause among this node's and the other nodes'
        records of the round known now (``_keep_failure``), so a node whose ranks failed only
        because a peer's did names the peer's rank and node; else the event that stopped it."""
        records = self.tally.failure.records if self.tally.failure is not None else []
        peers = record_exits(records)
        job = root_cause([*peers, *([cause] if cause is not None else [])])
        if job is not None and job is not cause:
            return replace(AttemptFailure.of_cause(job, None, None), local=False)
        if cause is not None:
            return AttemptFailure.of_cause(cause, watch.hang, watch.report_path)
        return AttemptFailure.of_event(event, describe_event(event) if event is not None else "")

    def _next_step(
        self,
        joined: RendezvousResult,
        failed_here: bool,
        event: EventKind | None,
        mark: ProgressMark,
        plan: RoundPlan,
    ) -> tuple[Step, RoundVerdict | None]:
        """The policy's step after a failed round, with the job's verdict on the round
        when one is needed (None otherwise)."""
        verdict = None
        budget_left = joined.restart_count < self.config.recovery.max_restarts
        if judged(failed_here=failed_here, event=event, budget_left=budget_left):
            verdict = self._judge(mark.progressed(plan))
        step = decide(
            failed_here=failed_here,
            event=event,
            repeated=verdict is not None and verdict.repeated,
            progressed=verdict is not None and verdict.progressed,
        )
        if verdict is not None and verdict.repeated and step is Step.RESTART:
            log.warning(
                "the same failure as the last one (%s), but the job progressed since "
                "(a checkpoint, or a progress counter that moved, on some node; or unknown progress)",
                verdict.failure,
            )
        return step, verdict

    def _judge(self, progressed: bool) -> RoundVerdict:
        """The job's verdict on the round (waiting for the other nodes' evidence); a signal
        meanwhile ends the wait at once, and the job stops, as in ``_next_round``."""
        try:
            with self.signals.raising():
                return self.rdzv.judge_round(progressed, failure_signature)
        except Interrupted as exc:
            self.between.stopped_waiting(exc, "this node, waiting for the other nodes' verdict")
        except RendezvousError as exc:
            self.between.cut_short(exc, self._no_round(exc))

    def _rejoined(self, joined: RendezvousResult) -> bool:
        """This node lost the store (or fenced itself): with restarts left, wait for the
        store and come back as a new member of the next round (the others count this node
        lost and spend the restart); False when it cannot, and the job ends here as before."""
        left = self.config.recovery.max_restarts - joined.restart_count
        if left <= 0:
            return False
        log.warning(
            "lost the rendezvous store; rejoining the job when it answers again (%d of %d "
            "restarts left)", left, self.config.recovery.max_restarts,
        )  # fmt: skip
        try:
            with self.signals.raising():
                back = self.peers is not None and self.peers.rejoin()
        except Interrupted as exc:
            self.between.stopped_waiting(exc, "this node, waiting for the rendezvous store")
        # Back, the node claims the restart as any node of a failed round does (the first
        # claim decides for all): the budget counts it however many nodes lost the store.
        return back and self._restarted(joined)

    def _claim_restart(self) -> bool:
        try:
            return self.rdzv.claim_restart(self.config.recovery.max_restarts)
        except RendezvousError as exc:
            self.between.cut_short(exc, self._no_round(exc))

    def _no_round(self, exc: RendezvousError) -> str:
        """Why the job ended when the next round could not form."""
        if self.tally.failure is None:
            return str(exc)
        return f"the restart round could not form: {exc}"

    def _preempt_watch(self, joined: RendezvousResult) -> PreemptWatch:
        return PreemptWatch(
            self.config.recovery.preempt_grace,
            self.rdzv.report_preemption,
            joined.node_rank,
            on_start=self._preempt_event,
        )

    def _preempt_event(self, preemption: Preemption) -> None:
        deadline = preemption.time + preemption.grace  # the first node's wall clock
        self.events.emit("preempt", signal=preemption.signal, deadline=deadline)

    def _job_stacks(self, joined: RendezvousResult) -> JobStacks | None:
        if self.peers is None or joined.num_nodes == 1:
            return None
        return JobStacks(self.peers.stacks(), joined, self.run_dir)

    def _poll(self, watch: RoundWatch) -> Callable[[], JobEvent | None]:
        return lambda: watch.hear(self.rdzv.poll())

    def _tick_every(self) -> float | None:
        """The supervisor's tick when the rendezvous has nothing to poll (one node): as
        often as progress is read for the stall timeout, else once a second (the status
        file, request files and progress samples need no more); None: every monitor
        interval, for the peers' events."""
        if not self.rdzv.quiet:
            return None
        if self.config.checks.stall_timeout:
            return self._check_every()
        return max(self.config.workers.monitor_interval, QUIET_TICK)

    def _check_every(self) -> float:
        """How often progress is read: often enough to notice a stall within a tenth of the
        timeout (at most once a second), never more often than the monitor interval."""
        timeout = self.config.checks.stall_timeout or 0.0
        return max(self.config.workers.monitor_interval, min(1.0, timeout / 10))


def _ended_by_preemption(result: RoundResult) -> bool:
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
