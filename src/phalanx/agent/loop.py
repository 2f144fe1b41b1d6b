"""The restart loop of one agent run, a small state machine: each step takes the run's
state so far (``RunState``) and returns the next, or how the run ended (``RunEnd``; its
ends are ``agent.endings`` and ``agent.between``, its report ``agent.runend``).

One round's steps (join, check, supervise, judge, restart or end) read in order here; what
they call lives in ``between``, ``endings``, ``policy`` and ``watching``. A round that ended
before its workers started (its watch heard a member lost, a peer's failure, the job
stopped, the store lost: often during the node check) goes from the join to the step after
a failure without them (``_unstarted``); one preempted before they started (another node's
notice, or this node's own signal, which stopped the check) to the run's end as preempted
without them (``_preempted_unstarted``), and one this node was asked to stop in by a signal
to the end of a stop (``_stopped_unstarted``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from phalanx import exclusion
from phalanx.agent import pace
from phalanx.agent.attempt_events import AttemptEvents, AttemptFailure, emit_failure
from phalanx.agent.between import Between
from phalanx.agent.checking import CheckedNodes
from phalanx.agent.crashloop import ProgressMark, failure_signature
from phalanx.agent.describe import describe_event
from phalanx.agent.joining import Joining, no_round
from phalanx.agent.played import Failed, Played, ended_by_preemption
from phalanx.agent.policy import Step, decide, judged
from phalanx.agent.runend import RunEnd
from phalanx.agent.sofar import RunState
from phalanx.agent.stopped import asked_to_stop
from phalanx.agent.watching import Watching
from phalanx.config import LaunchConfig
from phalanx.errors import CutOff, Interrupted, RendezvousError, signal_name
from phalanx.hang.watch import RoundWatch
from phalanx.plan import RoundPlan, build_plan
from phalanx.rendezvous.api import (
    EventKind,
    JobEvent,
    RendezvousHandler,
    Round,
    RoundVerdict,
    restarts_left,
)
from phalanx.rendezvous.roundend import ENDS_ROUND
from phalanx.report.exits import root_cause
from phalanx.report.job import record_exits
from phalanx.report.oom import OomProbe
from phalanx.resources.limits import StartFailed
from phalanx.status import StatusService
from phalanx.supervisor.exits import WorkerExit
from phalanx.supervisor.group import Due, OnTick, Outcome, RoundResult, Supervisor
from phalanx.supervisor.preempt import Preemption, PreemptWatch
from phalanx.supervisor.signals import SignalWatcher

log = logging.getLogger("phalanx")


class Rounds:
    """The restart loop of one agent run, and the job-wide failure report at its end.

    Budget policy (see ``rendezvous.api``): a worker failure here or on a peer, and a lost
    node, spend a restart (``claim_restart``, job-wide); a node waiting to join (elastic
    scale-up) re-forms the round without spending one; a peer that gave up or a lost store
    ends the job; a round that ended before its workers started spends as its event does
    once they ran (``_unstarted``: the round formed). Before a restart, the job judges the
    round (``judge_round``, with this node's evidence from ``crashloop``): the same failure
    as the previous one with no progress anywhere is a crash loop, on every node at once.
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
        checked: CheckedNodes | None = None,
    ) -> None:
        """``between``: the run's ends (its ``ends``: after a round; itself: between rounds),
        which read the state this loop hands them. ``checked``: this agent's node check so
        far (its figure may have been measured before the first join: ``probe_ahead``)."""
        self.config = config
        self.status = status
        self.rdzv = rendezvous
        self.supervisor = supervisor
        self.signals = signals
        self.run_dir = run_dir
        self.base_env = base_env
        self.between = between
        self.ends = between.ends
        self.events = self.ends.events
        self.joining = Joining(
            config, rendezvous, signals, run_dir, self.events, between, checked or CheckedNodes()
        )
        self._exclude = exclusion.ExcludeAfter(config, run_dir, self.events)  # --exclude-after
        self.watching = Watching(config, rendezvous, signals, run_dir, status, self.events)
        self.peers = rendezvous.peers()  # None: a single node
        if self.peers is not None:  # a peer's event acted on at once, not at a tick
            self.peers.on_event(supervisor.wake)

    def run(self) -> RunEnd:
        """Run rounds until the run ends: each step takes the run's state and returns the
        next one, or how the run ended."""
        state = RunState()
        while True:
            step = self._round(state)
            if isinstance(step, RunEnd):
                self.joining.beside.close()
                return step
            state = step

    def _round(self, state: RunState) -> RunState | RunEnd:
        """One round: join it, run its workers until they end, then the step after it; or,
        when the round ended before they started, that step without them."""
        joining = self.joining.next_round(state)
        if isinstance(joining, RunEnd):
            return joining
        at, state = joining
        joined = at.result
        state = replace(state, attempts=state.attempts + 1)
        signum = self.signals.pending()
        if signum is not None:  # a stop signal since the join (it stopped the node check)
            return self._stopped_unstarted(state, at, signum)
        heard = self.rdzv.poll()  # the round's first event, if its watch heard one already
        if heard is not None and heard.kind in ENDS_ROUND:
            return self._unstarted(state, at, heard)
        preempt = self.watching.preempt(at)
        preemption = self._preempted_first(preempt, heard)
        if preemption is not None:
            return self._preempted_unstarted(state, at, preemption)
        plan = build_plan(self.config, joined, self.run_dir, self.base_env)
        mark = ProgressMark.take(plan)
        attempt = AttemptEvents(self.events, plan, joined.round, state.attempts, state.redo)
        watch = self.watching.round_watch(plan, at, attempt)
        probe = OomProbe()
        tick, slow = self.watching.tick(plan, at, attempt, watch)
        poll = self.watching.poll(watch, heard)
        try:
            result = self._supervise(state, plan, poll, tick, preempt, watch.due)
        finally:
            watch.close()  # a naming's dump still under way: said before the round's end
            self.joining.beside.over()  # a check beside its workers: moot now
        if isinstance(result, RunEnd):
            return result
        attempt.ended(result.exits)
        state = replace(self.joining.beside.fold(state), redo=attempt.peak)  # "back": the peak
        slow.leave()  # named a straggler under --straggler-action exclude: leaves the job
        exits = [replace(e, node_rank=joined.node_rank) for e in result.exits]
        return self._ended(state, Played(at, plan, result, exits, watch, probe, mark, attempt))

    def _unstarted(self, state: RunState, at: Round, event: JobEvent) -> RunState | RunEnd:
        """Round ``at`` ended before its workers started: its watch heard ``event`` first
        (often during the node check, which stopped on it). The step after it is the one a
        round stopped by ``event`` takes once its workers ran -- a stop, a restart (spent as
        for any round that formed: torchrun's workers would have started and failed), the
        job's end -- recorded as such (``failure``, ``stopped``: no ``workers_started``), but
        no worker is forked for the dead round: it would cost the restart a fork, an import
        and a Gloo start bound to fail, and one that needs no peer could finish before this
        node acted on the event (finished workers are not run again: the job would fail)."""
        joined = at.result
        why = describe_event(event)
        log.warning("round %d ended before its workers started: %s", joined.round, why)
        stop = asked_to_stop(RoundResult(Outcome.REMOTE, (), event), self.between.stop_heard())
        if stop is not None:  # another node was stopped by a signal: so is the job
            return self.ends.interrupted(state, joined, [], *stop)
        state = replace(state, failure=self.between.keep_failure(joined, [], event, None))
        failure = self._failure_events(state, None, event, None)
        emit_failure(self.events, joined.round, state.attempts, failure, stop_began=0.0)
        return self._failed(state, Failed(at, [], event, None, lambda: False), failed_here=False)

    def _stopped_unstarted(self, state: RunState, at: Round, signum: int) -> RunEnd:
        """This node was asked to stop by ``signum`` before round ``at``'s workers started
        (often during the node check, which stopped on it): the end of a stop once they ran
        -- the other nodes told, the stop report, 128 + the signal -- with none forked."""
        joined = at.result
        why = f"this node was stopped by {signal_name(signum)}"
        log.warning("round %d ended before its workers started: %s", joined.round, why)
        return self.ends.interrupted(state, joined, [], signum, None)

    def _preempted_first(self, preempt: PreemptWatch, heard: JobEvent | None) -> Preemption | None:
        """The job's preemption, when one came before the round's workers started: another
        node's notice (``heard``, the round's first event) or this node's own signal (which
        stopped the node check), begun as the supervisor begins one -- the line, the
        ``preempt`` event, the notice told to the other nodes -- with no worker to tell."""
        if heard is not None and heard.kind is EventKind.PREEMPTED:
            preempt.hear(heard, ())
        signum = self.signals.take_preempt()
        if signum is not None:  # after a peer's notice, this node joins it (its deadline)
            preempt.begin(signum, ())
        return preempt.preemption

    def _preempted_unstarted(self, state: RunState, at: Round, preemption: Preemption) -> RunEnd:
        """Round ``at`` was preempted before its workers started (often during the node
        check, which stopped on it). The run ends as a round preempted once its workers ran
        does -- a wait for the other nodes until the job's deadline, the report, exit 75, the
        requeue; no restart spent -- with none forked: they would cost a fork, an import and
        a Gloo start only to be signalled at once, and a short one could finish, or save
        half-way, before the deadline stopped it."""
        joined = at.result
        node = preemption.node
        where = f"node {node}" if node not in (None, joined.node_rank) else "this node"
        why = f"the job is preempted ({preemption.signal} on {where})"
        log.warning("round %d ended before its workers started: %s", joined.round, why)
        return self.ends.preempted(state, at, None, [], preemption)

    def _ended(self, state: RunState, played: Played) -> RunState | RunEnd:
        """After the round's workers ended: the run's end (success, a preemption, a stop),
        or the failure recorded and the step after it."""
        joined, result, exits = played.joined, played.result, played.exits
        if result.preemption is not None and ended_by_preemption(result):
            return self.ends.preempted(
                state, played.at, played.plan, exits, result.preemption, result.event
            )
        if result.outcome is Outcome.SUCCEEDED:
            return self.ends.succeeded(state, played.at, played.plan, exits)
        stop = asked_to_stop(result, self.between.stop_heard())
        if stop is not None:  # here or on another node: the job stops, with no failure
            return self.ends.interrupted(state, joined, exits, *stop)
        exits, cause = self.ends.record_failure(
            exits, result.event, played.watch, played.probe, played.at
        )
        event = result.event.kind if result.event is not None else None
        if cause is not None or event is not EventKind.NODE_WAITING:  # a scale-up is no failure
            watch = played.watch
            kept = self.between.keep_failure(
                joined, exits, result.event, watch.hang or watch.peer_hang
            )
            state = replace(state, failure=kept)
            played.attempt.failed(
                self._failure_events(state, cause, result.event, watch),
                stop_began=self.supervisor.stop_began,
            )
        if result.preemption is not None:  # a failure during the grace: no restart
            hang = played.watch.hang
            return self.ends.fail(state, joined, exits, result.event, hang, None, crash_loop=False)
        return self._failed(state, replace(played, exits=exits).failed(), cause is not None)

    def _failed(self, state: RunState, failed: Failed, failed_here: bool) -> RunState | RunEnd:
        """After a failed round: rejoin after a lost store (or fail over), re-form for a joining
        node, restart within the budget, or end the job (a crash loop, the budget spent...)."""
        at, joined, event = failed.at, failed.at.result, failed.kind
        if event is EventKind.STORE_LOST or failed_here:
            back = self._rejoined(state, at, failed_here)
            if back is not None:  # back as a new member: the others spent the restart for it
                return back
        decided = self._next_step(state, at, failed_here, event, failed.progressed)
        if isinstance(decided, RunEnd | RunState):  # (a run state: failed over meanwhile)
            return decided
        step, verdict = decided
        if step is not Step.REFORM:
            self._exclude.after_round(
                self.rdzv.failures, joined, failed_here, leave=step is Step.RESTART
            )
        if step is Step.REFORM:
            self.events.emit("reform", round=joined.round, reason="a node is waiting to join")
            return replace(state, reforms=state.reforms + 1)  # a scale-up: no restart spent
        if step is Step.RESTART:
            restarted = self._restarted(state, at)
            if restarted is not None:
                return restarted
        return self.ends.fail(
            state, joined, failed.exits, failed.event, failed.hang, verdict,
            crash_loop=step is Step.CRASH_LOOP,
        )  # fmt: skip

    def _restarted(self, state: RunState, at: Round) -> RunState | RunEnd | None:
        """Claim a restart of the job's budget after round ``at`` (the first claim of any
        node decides for all), said in the log once the next round forms: the state to
        restart with; None when the job has none to give."""
        joined = at.result
        try:
            claimed = at.claim_restart(self.config.recovery.max_restarts)
        except RendezvousError as exc:
            return self.between.cut_short(state, exc, no_round(state, exc))
        if not claimed:
            return None
        self.events.emit(
            "restart",
            restart=joined.restart_count + 1,  # the job's count (re-forms are not)
            max_restarts=self.config.recovery.max_restarts,
            round=joined.round,
        )
        return replace(state, restarting=True)

    def _supervise(
        self,
        state: RunState,
        plan: RoundPlan,
        poll: Callable[[], JobEvent | None],
        tick: OnTick,
        preempt: PreemptWatch,
        due: Due,
    ) -> RoundResult | RunEnd:
        try:
            every = pace.tick_every(self.config, self.rdzv.quiet)
            return self.supervisor.run(plan, self.signals, poll, tick, preempt, every, due)
        except StartFailed as exc:  # a limit reached: no round without every worker
            return self.between.cut_short(state, exc, str(exc))

    def _failure_events(
        self,
        state: RunState,
        cause: WorkerExit | None,
        event: JobEvent | None,
        watch: RoundWatch | None,
    ) -> AttemptFailure:
        """The failure to record: the job's root cause among this node's and the other nodes'
        records of the round known now (``state.failure``), so a node whose ranks failed only
        because a peer's did names the peer's rank and node; else the event that stopped it."""
        records = state.failure.records if state.failure is not None else []
        peers = record_exits(records)
        job = root_cause([*peers, *([cause] if cause is not None else [])])
        if job is not None and job is not cause:
            return replace(AttemptFailure.of_cause(job, None, None), local=False)
        if cause is not None and watch is not None:
            return AttemptFailure.of_cause(cause, watch.hang, watch.report_path)
        return AttemptFailure.of_event(event, describe_event(event) if event is not None else "")

    def _next_step(
        self,
        state: RunState,
        at: Round,
        failed_here: bool,
        event: EventKind | None,
        progressed: Callable[[], bool],
    ) -> tuple[Step, RoundVerdict | None] | RunEnd | RunState:
        """The policy's step after a failed round, with the job's verdict on the round
        when one is needed (None otherwise; ``progressed``: this node's evidence for it)."""
        verdict = None
        count = at.result.restart_count
        budget_left = restarts_left(count, self.config.recovery.max_restarts) > 0
        if judged(failed_here=failed_here, event=event, budget_left=budget_left):
            judging = self._judge(state, at, progressed())
            if isinstance(judging, RunEnd | RunState):
                return judging
            verdict = judging
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

    def _judge(
        self, state: RunState, at: Round, progressed: bool
    ) -> RoundVerdict | RunEnd | RunState:
        """The job's verdict on round ``at`` (waiting for the other nodes' evidence); a
        signal meanwhile ends the wait at once, and the job stops, as in ``Joining.next_round``.
        The store lost meanwhile (its host went down while the nodes judged): the failover
        of any loss after a failed round (the state to restart with), else the job ends."""
        try:
            with self.signals.raising():
                return at.judge_round(progressed, failure_signature)
        except Interrupted as exc:
            where = "this node, waiting for the other nodes' verdict"
            return self.between.stopped_waiting(state, exc, where)
        except RendezvousError as exc:
            back = self._rejoined(state, at, failed_here=True)  # (only once it does not answer)
            return back if back is not None else self.between.cut_short(state, exc, no_round(state, exc))  # fmt: skip

    def _rejoined(self, state: RunState, at: Round, failed_here: bool) -> RunState | RunEnd | None:
        """This node lost the store (or fenced itself; or its workers failed and the store's
        host went with their peers: ``Peers.rejoin``): with restarts left, come back as a new
        member of the next round, on the store or its successor's (the others count this node
        lost and spend the restart); None when it cannot, and the job goes on as before."""
        left = restarts_left(at.result.restart_count, self.config.recovery.max_restarts)
        if left <= 0:
            return None
        if not failed_here:
            log.warning(
                "lost the rendezvous store; rejoining the job when it answers again (%d of %d "
                "restarts left)", left, self.config.recovery.max_restarts,
            )  # fmt: skip
        try:
            with self.signals.raising():
                back = self.peers is not None and self.peers.rejoin(failover_only=failed_here)
            if back and self.peers is not None and (moved := self.peers.store_moved()) is not None:
                self.events.emit("store_moved", **moved)
        except Interrupted as exc:
            return self.between.stopped_waiting(state, exc, "this node, waiting for the rendezvous store")  # fmt: skip
        except CutOff as exc:  # superseded: the others moved the store while it was away
            return self.between.cut_off(state, exc)
        # Back, the node claims the restart as any node of a failed round does (the first
        # claim decides for all): the budget counts it however many nodes lost the store.
        return self._restarted(state, at) if back else None
