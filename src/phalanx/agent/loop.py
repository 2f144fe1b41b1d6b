"""The restart loop of one agent run, and the job-wide failure report at its end."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from phalanx.agent import preempted
from phalanx.agent.crashloop import ProgressMark, failure_signature
from phalanx.agent.policy import Step, decide, judged
from phalanx.agent.stopped import asked_to_stop, stop_report
from phalanx.config import LaunchConfig
from phalanx.consistency.compare import mismatch_table
from phalanx.errors import Interrupted, JobFailed, MismatchError, Preempted, RendezvousError
from phalanx.events.attempt import AttemptEvents, AttemptFailure
from phalanx.events.figures import RecoveryTracker
from phalanx.events.log import EventLog
from phalanx.hang.analysis import HangAnalysis
from phalanx.hang.jobstacks import JobStacks
from phalanx.hang.stacks import PEER_DUMP_WAIT
from phalanx.hang.watch import RoundWatch
from phalanx.plan import RoundPlan, build_plan
from phalanx.rendezvous.api import (
    EventKind,
    JobEvent,
    RendezvousHandler,
    RendezvousResult,
    RoundVerdict,
)
from phalanx.report import job as jobreport
from phalanx.report.exits import WorkerExit, root_cause
from phalanx.report.oom import OomProbe
from phalanx.report.recovery import summary_lines
from phalanx.status import StatusService, launcher
from phalanx.supervisor.group import Outcome, RoundResult, Supervisor
from phalanx.supervisor.preempt import Preemption, PreemptWatch, from_notice
from phalanx.supervisor.signals import SignalWatcher
from phalanx.worker.contract import STACK_SIGNAL
from phalanx.worker.nofollow import replace_file

log = logging.getLogger("phalanx")
LAUNCHER_FILE = launcher.LAUNCHER_FILE  # the agent's pid, for ``phalanx stacks RUN_DIR``


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
        events: EventLog,
        status: StatusService,
        recovery: RecoveryTracker | None = None,
    ) -> None:
        """``recovery``: the figures of this run's events so far (fed by ``events``), printed
        and saved in ``report.json`` at the end when there was an incident."""
        self.config = config
        self.events = events
        self.status = status
        self.recovery = recovery
        self.rdzv = rendezvous
        self.supervisor = supervisor
        self.signals = signals
        self.run_dir = run_dir
        self.base_env = base_env
        self.attempts = 0

    def run(self) -> int:
        while True:
            joined = self._next_round()
            plan = build_plan(self.config, joined, self.run_dir, self.base_env)
            mark = ProgressMark.take(plan)
            self.attempts += 1
            attempt = AttemptEvents(self.events, plan, joined.round, self.attempts)
            watch = RoundWatch(
                plan,
                stall_timeout=self.config.stall_timeout,
                requests=self.signals if self.signals.stacks_active else None,
                check_every=self._check_every(),
                job=self._job_stacks(joined),
            )
            probe = OomProbe()
            self.status.begin(plan, joined, self.rdzv.status_exchange())
            tick = self.status.watch(attempt.watch(watch.tick))
            preempt = self._preempt_watch(joined)
            result = self.supervisor.run(plan, self.signals, self._poll(watch), tick, preempt)
            attempt.ended(result.exits)
            exits = [replace(e, node_rank=joined.node_rank) for e in result.exits]
            if result.preemption is not None and _ended_by_preemption(result):
                self._preempted(joined, plan, exits, result.preemption, result.event)
            if result.outcome is Outcome.SUCCEEDED:
                return self._succeeded(joined, plan, exits)
            stop = asked_to_stop(result)
            if stop is not None:  # here or on another node: the job stops, with no failure
                self._interrupted(joined, exits, *stop)
            exits, cause = self._record_failure(exits, result.event, watch, probe)
            event = result.event.kind if result.event is not None else None
            if cause is not None or event is not EventKind.NODE_WAITING:  # a scale-up is no failure
                attempt.failed(
                    self._failure_events(cause, result.event, watch),
                    stop_began=self.supervisor.stop_began,
                    stall_timeout=self.config.stall_timeout,
                )
            if result.preemption is not None:  # a failure during the grace: no restart
                self._fail(joined, exits, result.event, watch.hang, None, crash_loop=False)
            step, verdict = self._next_step(joined, cause is not None, event, mark, plan)
            if step is Step.REFORM:
                self.events.emit("reform", round=joined.round, reason="a node is waiting to join")
                continue  # a scale-up: re-form the round, no restart spent
            hang = watch.hang or watch.peer_hang
            if step is Step.RESTART and self.rdzv.claim_restart(self.config.max_restarts):
                log.warning(
                    "restarting the worker group (restart %d of %d)",
                    self.attempts, self.config.max_restarts,
                )  # fmt: skip
                self.events.emit(
                    "restart",
                    restart=self.attempts,
                    max_restarts=self.config.max_restarts,
                    round=joined.round,
                )
                continue
            crash_loop = step is Step.CRASH_LOOP
            self._fail(joined, exits, result.event, hang, verdict, crash_loop=crash_loop)

    def _next_round(self) -> RendezvousResult:
        """Join the next round; a signal meanwhile ends the wait at once, and the other nodes
        are told this node left (the job stops: it cannot form without it)."""
        self.events.emit("rdzv_start", attempt=self.attempts + 1)
        began = time.monotonic()
        try:
            with self.signals.raising():
                joined = self.rdzv.next_round(self.config.nproc_per_node)
        except Interrupted as exc:
            self.rdzv.report_done(False, signum=exc.signum)
            self._stop_report([], exc.signum, self.events.node, "this node, in the rendezvous")
            raise
        self.events.node = joined.node_rank
        self.events.emit(
            "rdzv_done",
            round=joined.round,
            attempt=self.attempts + 1,
            num_nodes=joined.num_nodes,
            world_size=joined.world_size,
            members=[n.hostname for n in sorted(joined.nodes, key=lambda n: n.node_rank)],
            restart_count=joined.restart_count,
            seconds=round(time.monotonic() - began, 3),
        )
        self._check_same_code(joined)
        if joined.num_nodes > 1 or self.attempts == 0:
            log.info(
                "round %d: node %d of %d, world size %d, master %s:%d",
                joined.round, joined.node_rank, joined.num_nodes, joined.world_size,
                joined.master_addr, joined.master_port,
            )  # fmt: skip
        return joined

    def _failure_events(
        self, cause: WorkerExit | None, event: JobEvent | None, watch: RoundWatch
    ) -> AttemptFailure:
        if cause is not None:
            return AttemptFailure.of_cause(cause, watch.hang, watch.report_path)
        return AttemptFailure.of_event(event, _describe_event(event) if event is not None else "")

    def _check_same_code(self, joined: RendezvousResult) -> None:
        """Stop the job before any worker starts when the members' code or versions differ
        (every node computes the same table from the same records, so every node stops; the
        others also see ``JOB_STOPPED``), or warn with the table under ``allow_mismatch``."""
        hint = (
            "starting anyway (--allow-mismatch)"
            if self.config.allow_mismatch
            else "run the same code, files and versions on every node, or pass "
            "--allow-mismatch (phalanx.spawn: allow_mismatch=True) to start anyway"
        )
        table = mismatch_table(joined.nodes, joined.fingerprints, hint)
        if table is None:
            return
        if self.config.allow_mismatch:
            log.warning("round %d: %s", joined.round, table)
            return
        self.rdzv.report_done(False)
        raise MismatchError(f"round {joined.round}: {table}")

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
        budget_left = joined.restart_count < self.config.max_restarts
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
                "(a checkpoint, or a progress counter that moved, on some node)",
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
            self.rdzv.report_done(False, signum=exc.signum)
            raise

    def _succeeded(self, joined: RendezvousResult, plan: RoundPlan, exits: list[WorkerExit]) -> int:
        """This node's workers all finished: wait for the others (the exit barrier). Read
        first whether the job was preempted: ranks that saw another node's preemption
        through ``phalanx.preempted()``'s collective may end before this node hears of it
        (the notice is in the store before any worker is told)."""
        notice = self.rdzv.preemption()
        if notice is not None:
            self._preempted(joined, plan, exits, from_notice(notice, self.config.preempt_grace))
        self.rdzv.report_done(True)
        log.info("all %d workers finished", len(exits))
        late = self.rdzv.await_peers(lambda: self.signals.pending() is not None)
        signum = self.signals.pending()
        if signum is not None:
            raise Interrupted(signum)  # while waiting for the other nodes to finish
        if late is None:
            lines, figures = self._recovery_figures()
            for line in lines:
                log.info("%s", line)
            if figures is not None:  # a job that recovered: its figures, in a report of its own
                data = {"attempts": self.attempts, "outcome": "succeeded", "root_cause": None}
                data["recovery"] = figures
                write_bounded(self.run_dir / "report.json", json.dumps(data, indent=2))
            return 0
        # The job failed elsewhere after these workers finished: it cannot restart (they
        # would not run again), so every node reports the failure and stops.
        log.warning("the job failed after this node's workers finished: %s", _describe_event(late))
        self._fail(joined, exits, late, None, None, crash_loop=False)

    def _interrupted(
        self,
        joined: RendezvousResult,
        exits: list[WorkerExit],
        signum: int,
        event: JobEvent | None,
    ) -> NoReturn:
        """Asked to stop by ``signum`` (``phalanx stop``, Ctrl-C), here (``event`` None: the
        other nodes are told, and stop too) or on the node of ``event``: write the report
        (no root cause; who stopped the job) and end as interrupted by that signal."""
        self.rdzv.report_done(False, signum=signum if event is None else None)
        node = joined.node_rank if event is None else event.node_rank
        if event is not None:
            log.warning("%s", _describe_event(event))
        self._stop_report(exits, signum, node, "this node" if event is None else f"node {node}")
        raise Interrupted(signum)

    def _stop_report(
        self, exits: list[WorkerExit], signum: int, node: int | None, where: str
    ) -> None:
        """``report.json`` of a job stopped by ``signum`` on ``where`` (no root cause)."""
        _, figures = self._recovery_figures()
        data = stop_report(exits, self.attempts, signum, node, where, figures)
        write_bounded(self.run_dir / "report.json", json.dumps(data, indent=2))

    def _preempt_watch(self, joined: RendezvousResult) -> PreemptWatch:
        return PreemptWatch(
            self.config.preempt_grace,
            self.rdzv.report_preemption,
            joined.node_rank,
            on_start=self._preempt_event,
        )

    def _preempt_event(self, preemption: Preemption) -> None:
        deadline = preemption.time + preemption.grace  # the first node's wall clock
        self.events.emit("preempt", signal=preemption.signal, deadline=deadline)

    def _preempted(
        self,
        joined: RendezvousResult,
        plan: RoundPlan,
        exits: list[WorkerExit],
        preemption: Preemption,
        gone: JobEvent | None = None,
    ) -> NoReturn:
        """The round ended after a preemption: wait for the other nodes until the job's
        deadline at most (a failure of theirs during the grace is the job's failure; a node
        ``gone`` meanwhile ended the round: nobody to wait for), report, requeue (node rank
        0), exit 75."""
        late = gone
        if gone is None:
            self.rdzv.report_done(True)  # no new round: finished nodes are not run again
            late = self.rdzv.await_peers(
                lambda: (
                    self.signals.pending() is not None or time.monotonic() >= preemption.deadline
                )
            )
        else:
            self.rdzv.report_done(False)
        signum = self.signals.pending()
        if signum is not None:
            raise Interrupted(signum)
        if late is not None and late.kind is EventKind.PEER_FAILED:
            log.warning("the job failed during its preemption grace: %s", _describe_event(late))
            self._fail(joined, exits, late, None, None, crash_loop=False)
        if late is not None:  # a node gone or given up: the scheduler's stop, as announced
            log.warning("during the preemption grace: %s", _describe_event(late))
        text, data = preempted.report(
            preemption, exits, preempted.last_step(plan), joined.node_rank
        )
        print(text, file=sys.stderr, flush=True)
        lines, figures = self._recovery_figures()
        for line in lines:
            log.info("%s", line)
        if figures is not None:
            data["recovery"] = figures
        write_bounded(self.run_dir / "report.json", json.dumps(data, indent=2))
        if self.config.requeue and joined.node_rank == 0:
            preempted.requeue(self.base_env)
        raise Preempted(signal.Signals[preemption.signal], f"preempted by {preemption.signal}")

    def _record_failure(
        self,
        exits: list[WorkerExit],
        event: JobEvent | None,
        watch: RoundWatch,
        probe: OomProbe,
    ) -> tuple[list[WorkerExit], WorkerExit | None]:
        """Classify this node's exits, tell the other nodes, say it; returns the exits and
        this node's root cause (None: its workers were stopped because of ``event``)."""
        exits = jobreport.classify_local(exits, probe)
        if watch.hang is not None:
            exits = jobreport.blame_hang(exits, watch.hang, watch.detected_at)
        cause = root_cause(exits)
        if cause is not None:
            record = cause.to_json()
            if watch.hang is not None:
                record["hang"] = watch.hang.to_json()
            seq = self.rdzv.report_failure(record)
            if seq is not None:  # the store's order of failures: this node's report needs it too
                exits = [replace(e, seq=seq) if e is cause else e for e in exits]
                cause = replace(cause, seq=seq)
            log.warning(
                "%s on %s: %s (attempt %d)%s",
                cause.who,
                cause.host,
                cause.reason if cause.kind == "hang" else cause.describe_exit(),
                self.attempts,
                f" [{cause.kind}]" if cause.kind else "",
            )
        elif event is not None:
            if watch.peer_hang is not None:
                # No failure of ours: only where our ranks were, for the job-wide analysis.
                self.rdzv.report_failure({"hang": watch.peer_hang.to_json()})
            log.warning("stopped local workers: %s", _describe_event(event))
        return exits, cause

    def _job_stacks(self, joined: RendezvousResult) -> JobStacks | None:
        exchange = self.rdzv.stacks()
        if exchange is None or joined.num_nodes == 1:
            return None
        return JobStacks(exchange, joined, self.run_dir)

    def _poll(self, watch: RoundWatch) -> Callable[[], JobEvent | None]:
        return lambda: watch.hear(self.rdzv.poll())

    def _check_every(self) -> float:
        """How often progress is read: often enough to notice a stall within a tenth of the
        timeout (at most once a second), never more often than the monitor interval."""
        timeout = self.config.stall_timeout or 0.0
        return max(self.config.monitor_interval, min(1.0, timeout / 10))

    def _fail(
        self,
        joined: RendezvousResult,
        exits: list[WorkerExit],
        event: JobEvent | None,
        hang: HangAnalysis | None,
        verdict: RoundVerdict | None,
        *,
        crash_loop: bool,
    ) -> NoReturn:
        """Print and save the job-wide report, then raise with the root cause's exit code."""
        self.rdzv.report_done(False)
        if event is not None and event.kind is EventKind.STORE_LOST:
            known = self.rdzv.poll()  # what is known of the store by now (after a fence)
            event = known if known is not None and known.kind is EventKind.STORE_LOST else event
        records = self._round_records(joined, waiting_for_hangs=hang is not None)
        lost = None
        if event is not None and event.kind is EventKind.NODE_LOST:
            lost = jobreport.lost_node(event, joined, _describe_event(event))
        lines, figures = self._recovery_figures()
        report = jobreport.build(
            exits,
            records,
            self.attempts,
            local_hang=hang,
            lost=lost,
            reason=_describe_event(event) if event is not None else "",
            extra={
                "outcome": "failed",
                "recovery": figures,
                "crash_loop": crash_loop,
                "verdict": verdict.to_json() if verdict is not None else None,
            },
        )
        text = report.text
        if crash_loop and verdict is not None:
            text += (
                f"\nphalanx: crash loop: the same failure twice in a row ({verdict.failure}) "
                "with no progress on any node in between (no checkpoint completed, no "
                "optimizer step or phalanx.step/heartbeat); not spending the remaining restarts."
            )
        print(text, file=sys.stderr, flush=True)
        for line in lines:
            log.info("%s", line)
        write_bounded(self.run_dir / "report.json", json.dumps(report.data, indent=2))
        cause = report.cause
        if cause is None:
            reason = _describe_event(event) if event is not None else ""
            raise RendezvousError(f"the job stopped: {reason or 'another node gave up'}")
        raise JobFailed(f"{cause.who} on {cause.host}: {cause.summary}", cause.exit_code)

    def _recovery_figures(self) -> tuple[list[str], dict[str, object] | None]:
        """The recovery figures of this node's run so far: the lines to say (one per
        incident, then the ETTR) and their JSON; none, and None, without an incident."""
        if self.recovery is None:
            return [], None
        figures = self.recovery.result(self.events.now())
        return summary_lines(figures), figures.to_json() if figures.incidents else None

    def _round_records(
        self, joined: RendezvousResult, *, waiting_for_hangs: bool
    ) -> list[dict[str, object]]:
        """The other nodes' failure records of this round. After a hang, wait (bounded) until
        every node has posted where its ranks were."""
        # After a hang: as long as a peer's dump can take (``PEER_DUMP_WAIT``).
        deadline = time.monotonic() + (PEER_DUMP_WAIT if waiting_for_hangs else 0.0)
        while True:
            records = [
                r
                for r in self.rdzv.failures()
                if r.get("round") == joined.round and r.get("node_rank") != joined.node_rank
            ]
            posted = {r.get("node_rank") for r in records if "hang" in r}
            done = len(posted) >= joined.num_nodes - 1 or time.monotonic() >= deadline
            if done or self.signals.pending() is not None:  # Ctrl-C: report what is here
                return records
            time.sleep(0.2)


def write_bounded(path: Path, text: str, timeout: float = 2.0) -> None:
    """Write ``path`` from a thread, waiting at most ``timeout``: a full disk or a filesystem
    that stops answering costs one line (the report was printed already), never the exit."""

    def write() -> None:
        try:
            replace_file(path, text.encode())  # never through a symlink planted there
        except OSError as exc:
            log.warning("cannot write %s (%s)", path, exc.strerror)

    writer = threading.Thread(target=write, name="phalanx-report", daemon=True)
    writer.start()
    writer.join(timeout)
    if writer.is_alive():
        log.warning("cannot write %s (its filesystem did not answer within %g s)", path, timeout)


def write_launcher_file(run_dir: Path, signals: SignalWatcher) -> None:
    data = {
        **launcher.this_process(),  # pid, host, start time (``phalanx stop`` checks it)
        "stacks_signal": STACK_SIGNAL.name if signals.stacks_active else None,
    }
    try:
        replace_file(run_dir / LAUNCHER_FILE, (json.dumps(data) + "\n").encode())
    except OSError as exc:
        log.warning(
            "cannot write %s (%s): phalanx stacks will not find this agent",
            run_dir / LAUNCHER_FILE,
            exc.strerror,
        )


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


def _describe_event(event: JobEvent) -> str:
    who = f"node {event.node_rank}" if event.node_rank is not None else "a node"
    text = {
        EventKind.PEER_FAILED: f"workers failed on {who}",
        EventKind.NODE_LOST: f"{who} was lost",  # the detail says how: heartbeat or lease
        EventKind.NODE_WAITING: "a node is waiting to join; re-forming the round",
        EventKind.JOB_STOPPED: f"{who} stopped the job",
        EventKind.STORE_LOST: "",  # the detail already names the store and the error
        EventKind.PREEMPTED: f"{who} was preempted",
    }[event.kind]
    if not text:
        return event.detail or "the rendezvous store cannot be reached"
    return f"{text}: {event.detail}" if event.detail else text
