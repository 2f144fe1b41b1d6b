"""How an agent run ends after a round, each end a ``RunEnd`` with the run's ``report.json``:
success after the exit barrier, a stop by signal, a preemption (exit 75), a failure (the
job-wide root-cause report). Each tells the other nodes what it must now, and returns what
is left to say and write (``agent.runend.Reporter``)."""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from phalanx.agent.describe import describe_event
from phalanx.agent.runend import RunEnd, Said, with_checked
from phalanx.agent.sofar import RunState
from phalanx.agent.stopped import stop_report, success_report
from phalanx.config import LaunchConfig
from phalanx.errors import Interrupted, JobFailed, PhalanxError, Preempted, RendezvousError
from phalanx.events.figures import RecoveryTracker
from phalanx.events.log import EventLog
from phalanx.hang.watch import RoundWatch
from phalanx.plan import RoundPlan
from phalanx.rendezvous.api import (
    EventKind,
    JobEvent,
    RendezvousHandler,
    RendezvousResult,
    Round,
    RoundVerdict,
)
from phalanx.rendezvous.settings import settings_problems
from phalanx.report import job as jobreport
from phalanx.report.exits import root_cause
from phalanx.report.job import record_exits
from phalanx.report.oom import OomProbe
from phalanx.report.recovery import summary_lines
from phalanx.supervisor.exits import WorkerExit
from phalanx.supervisor.preempt import Preemption, from_notice
from phalanx.supervisor.signals import SignalWatcher

# What only a hang or a preemption reads is imported where it is read: a launch that
# succeeds reads none of it, and its start is on its critical path.
if TYPE_CHECKING:
    from phalanx.hang.analysis import HangAnalysis

log = logging.getLogger("phalanx")


class Endings:
    """The ends of an agent run after a round; ``agent.loop.Rounds`` reaches them with the
    run's state so far (``RunState``: the counts and the last failure they report)."""

    def __init__(
        self,
        config: LaunchConfig,
        rendezvous: RendezvousHandler,
        signals: SignalWatcher,
        events: EventLog,
        recovery: RecoveryTracker | None = None,
    ) -> None:
        """``recovery``: the figures of this run's events so far (fed by ``events``),
        said and saved in ``report.json`` at the end when there was an incident."""
        self.config = config
        self.rdzv = rendezvous
        self.signals = signals
        self.events = events
        self.recovery = recovery

    def tell_done(self, ok: bool, *, signum: int | None = None, preempted: bool = False) -> None:
        """Tell the other nodes this node is done; best effort: with the store gone (its host
        lost) there is nobody to tell, and the report must still be written."""
        try:
            self.rdzv.report_done(ok, signum=signum, preempted=preempted)
        except (PhalanxError, OSError) as exc:
            log.warning("could not tell the other nodes this node is done: %s", exc)

    def succeeded(
        self, state: RunState, at: Round, plan: RoundPlan, exits: list[WorkerExit]
    ) -> RunEnd:
        """This node's workers all finished: wait for the others (the exit barrier). Read
        first whether the job was preempted: ranks that saw another node's preemption
        through ``phalanx.preempted()``'s collective may end before this node hears of it
        (the notice is in the store before any worker is told)."""
        notice = at.preemption()
        if notice is not None:
            preemption = from_notice(notice, self.config.recovery.preempt_grace)
            return self.preempted(state, at, plan, exits, preemption)
        self.rdzv.report_done(True)
        if self.config.workers.spawn_owner:  # one process here; the ranks were its children
            log.info(
                "the spawn-owner process finished (it started this node's %d ranks)",
                self.config.workers.nproc_per_node,
            )
        else:
            log.info("all %d workers finished", len(exits))
        late = at.await_peers(lambda: self.signals.pending() is not None)
        signum = self.signals.pending()
        if signum is not None:  # while waiting for the other nodes to finish
            return RunEnd("interrupted", Interrupted(signum))
        if late is None:
            lines, figures = self.recovery_figures()
            report = success_report(exits, state.attempts, figures)
            return RunEnd("succeeded", None, _info(lines), with_checked(report, state.checked))
        # The job failed elsewhere after these workers finished: it cannot restart (they
        # would not run again), so every node reports the failure and stops.
        log.warning("the job failed after this node's workers finished: %s", describe_event(late))
        return self.fail(state, at.result, exits, late, None, None, crash_loop=False)

    def interrupted(
        self,
        state: RunState,
        joined: RendezvousResult,
        exits: list[WorkerExit],
        signum: int,
        event: JobEvent | None,
    ) -> RunEnd:
        """Asked to stop by ``signum`` (``phalanx stop``, Ctrl-C), here (``event`` None: the
        other nodes are told, and stop too) or on the node of ``event``: write the report
        (no root cause; who stopped the job) and end as interrupted by that signal."""
        self.rdzv.report_done(False, signum=signum if event is None else None)
        node = joined.node_rank if event is None else event.node_rank
        if event is not None:
            log.warning("%s", describe_event(event))
        where = "this node" if event is None else f"node {node}"
        return self.stopped(state, exits, signum, node, where, Interrupted(signum))

    def stopped(
        self,
        state: RunState,
        exits: list[WorkerExit],
        signum: int,
        node: int | None,
        where: str,
        error: Interrupted,
    ) -> RunEnd:
        """A job stopped by ``signum`` on ``where``: its ``report.json`` (no root cause)."""
        _, figures = self.recovery_figures()
        data = stop_report(exits, state.attempts, signum, node, where, figures)
        return RunEnd("interrupted", error, (), with_checked(data, state.checked))

    def preempted(
        self,
        state: RunState,
        at: Round,
        plan: RoundPlan | None,
        exits: list[WorkerExit],
        preemption: Preemption,
        gone: JobEvent | None = None,
    ) -> RunEnd:
        """The round ended after a preemption: wait for the other nodes until the job's
        deadline at most (a failure of theirs during the grace is the job's failure; a node
        ``gone`` meanwhile ended the round: nobody to wait for), report, requeue (node rank
        0), exit 75. ``plan`` None: the round's workers never started."""
        from phalanx.agent import preempted

        late, joined = gone, at.result
        if gone is None:
            self.rdzv.report_done(True)  # no new round: finished nodes are not run again
            late = at.await_peers(
                lambda: (
                    self.signals.pending() is not None or time.monotonic() >= preemption.deadline
                )
            )
        else:
            self.rdzv.report_done(False)
        signum = self.signals.pending()
        if signum is not None:
            return RunEnd("interrupted", Interrupted(signum))
        if late is not None and late.kind is EventKind.PEER_FAILED:
            log.warning("the job failed during its preemption grace: %s", describe_event(late))
            return self.fail(state, joined, exits, late, None, None, crash_loop=False)
        if late is not None:  # a node gone or given up: the scheduler's stop, as announced
            log.warning("during the preemption grace: %s", describe_event(late))
        step = preempted.last_step(plan) if plan is not None else None
        text, data = preempted.report(preemption, exits, step, joined.node_rank)
        lines, figures = self.recovery_figures()
        if figures is not None:
            data["recovery"] = figures
        error = Preempted(signal.Signals[preemption.signal], f"preempted by {preemption.signal}")
        said = (Said(text, None), *_info(lines))
        requeue = self.config.recovery.requeue and joined.node_rank == 0
        return RunEnd("preempted", error, said, with_checked(data, state.checked), requeue)

    def record_failure(
        self,
        exits: list[WorkerExit],
        event: JobEvent | None,
        watch: RoundWatch,
        probe: OomProbe,
        at: Round,
    ) -> tuple[list[WorkerExit], WorkerExit | None]:
        """Classify this node's exits, tell the other nodes of round ``at``, say it; returns
        the exits and this node's root cause (None: its workers were stopped because of
        ``event``). The log names the round's restart count, as its attempt directory is."""
        exits = jobreport.classify_local(exits, probe)
        if watch.hang is not None:
            exits = jobreport.blame_hang(exits, watch.hang, watch.detected_at)
        cause = root_cause(exits)
        if cause is not None:
            record = cause.to_json()
            if watch.hang is not None:
                record["hang"] = watch.hang.to_json()
            seq = at.report_failure(record)
            if seq is not None:  # the store's order of failures: this node's report needs it too
                exits = [replace(e, seq=seq) if e is cause else e for e in exits]
                cause = replace(cause, seq=seq)
            if _unnamed_hang(watch, at):  # the job-wide report, every node's stacks, names it
                log.warning(
                    "hang found here (attempt %d): no suspect among this node's ranks; the "
                    "job's report names one from every node's stacks", at.result.restart_count,
                )  # fmt: skip
            else:
                log.warning(
                    "%s on %s: %s (attempt %d)%s",
                    cause.who,
                    cause.host,
                    cause.reason if cause.kind == "hang" else cause.describe_exit(),
                    at.result.restart_count,
                    f" [{cause.kind}]" if cause.kind else "",
                )
        elif event is not None:
            if watch.peer_hang is not None:
                # No failure of ours: only where our ranks were, for the job-wide analysis.
                at.report_failure({"hang": watch.peer_hang.to_json()})
            log.warning("stopped local workers: %s", describe_event(event))
        return exits, cause

    def fail(
        self,
        state: RunState,
        joined: RendezvousResult,
        exits: list[WorkerExit],
        event: JobEvent | None,
        hang: HangAnalysis | None,
        verdict: RoundVerdict | None,
        *,
        crash_loop: bool,
        records: list[dict[str, object]] | None = None,
        ended: str = "",
    ) -> RunEnd:
        """The job-wide report, and the root cause's exit code (``JobFailed``; without a
        cause, ``RendezvousError``). ``records``: the other nodes' failure records, read
        before (None: read them now); ``ended``: why the job ended, when not because of
        this round."""
        self.tell_done(False)
        if event is not None and event.kind is EventKind.STORE_LOST:
            known = self.rdzv.poll()  # what is known of the store by now (after a fence)
            event = known if known is not None and known.kind is EventKind.STORE_LOST else event
        if records is None:
            records = self.records_or_kept(
                state, joined, hang is not None, unexplained(joined, exits, event)
            )
        lost = None
        if event is not None and event.kind is EventKind.NODE_LOST:
            lost = jobreport.lost_node(event, joined, describe_event(event))
        lines, figures = self.recovery_figures()
        report = jobreport.build(
            exits,
            records,
            state.attempts,
            local_hang=hang,
            lost=lost,
            reason=describe_event(event) if event is not None else "",
            extra={
                "outcome": "failed",
                "recovery": figures,
                "crash_loop": crash_loop,
                "verdict": verdict.to_json() if verdict is not None else None,
                "ended": ended or None,
            },
        )
        # The recovery lines before the report, so the report (the cause, once) ends the output.
        said = (*_info(lines), Said(_failure_text(report.text, verdict, crash_loop, ended), None))
        data = with_checked(report.data, state.checked)
        return RunEnd("failed", _failure_error(report.cause, event, ended), said, data)

    def recovery_figures(self) -> tuple[list[str], dict[str, object] | None]:
        """The recovery figures of this node's run so far: the lines to say (one per
        incident, then the ETTR; none without a restart or re-form after an incident) and
        their JSON (None without an incident). ``now`` on the events' monotonic clock."""
        if self.recovery is None:
            return [], None
        figures = self.recovery.result(time.monotonic())
        return summary_lines(figures), figures.to_json() if figures.incidents else None

    def records_or_kept(
        self,
        state: RunState,
        joined: RendezvousResult,
        waiting_for_hangs: bool,
        explain: WorkerExit | None = None,
    ) -> list[dict[str, object]]:
        """The other nodes' records of this round; those kept from before (``state``) when
        the store cannot be read any more (``explain``: see ``round_records``)."""
        try:
            return self.round_records(joined, waiting_for_hangs=waiting_for_hangs, explain=explain)
        except RendezvousError:
            kept = state.failure
            return kept.records if kept is not None and kept.joined.round == joined.round else []

    def round_records(
        self,
        joined: RendezvousResult,
        *,
        waiting_for_hangs: bool,
        explain: WorkerExit | None = None,
    ) -> list[dict[str, object]]:
        """The other nodes' failure records of this round. After a hang, wait (bounded) until
        every node has posted where its ranks were. ``explain``: this node's root cause
        (``unexplained``); when its own evidence says a peer went away (``peer_error``), wait
        (bounded: a few heartbeats, ``cause_wait``) for the record of what did -- a peer's
        failure, or a node found lost or dead, whose record its watcher posts within a
        heartbeat or so of its guardian's last word -- so the report does not blame the rank
        that saw it. The wait ends as soon as such a record is in, or every other node of
        the round posted a record of its own (none was lost: nothing more will come)."""
        from phalanx.hang.stacks import PEER_DUMP_WAIT

        now = time.monotonic()
        hangs_until = now + (PEER_DUMP_WAIT if waiting_for_hangs else 0.0)
        cause_until = now + (
            self.cause_wait() if explain is not None and explain.peer_error else 0.0
        )
        while True:
            records = [
                r
                for r in self.rdzv.failures()
                if r.get("round") == joined.round and r.get("node_rank") != joined.node_rank
            ]
            posted = {r.get("node_rank") for r in records if "hang" in r}
            now = time.monotonic()
            hangs = len(posted) >= joined.num_nodes - 1 or now >= hangs_until
            told = {r.get("node_rank") for r in records if "returncode" in r}
            cause = (
                now >= cause_until
                or len(told) >= joined.num_nodes - 1
                or any(not e.peer_error for e in record_exits(records))
            )
            if (hangs and cause) or self.signals.pending() is not None:  # Ctrl-C: report now
                return records
            time.sleep(0.2)

    def cause_wait(self) -> float:
        """How long a peer error waits for the record of its cause: the watcher of a node
        whose agent died judges it once per ``heartbeat_interval``, after its guardian had
        the time to say so."""
        conf = self.config.rendezvous.rdzv_conf_dict
        settings, _ = settings_problems(conf, self.config.rendezvous.rdzv_backend, conf.keys())
        return 4 * settings.heartbeat_interval + 2.0


def unexplained(
    joined: RendezvousResult, exits: list[WorkerExit], event: JobEvent | None
) -> WorkerExit | None:
    """This node's root cause when only another node's record can explain it
    (``Endings.round_records`` waits for one): a peer error, in a round of several nodes
    that no event ended. None otherwise, and nothing is waited for: an event carries its
    own cause (a peer's failure record, a node found lost, a lost store, a stop), and a
    node alone has no peer to post one (a rank that ended early: "Connection closed by
    peer" on the others)."""
    cause = root_cause(exits)
    if cause is None or not cause.peer_error or joined.num_nodes < 2 or event is not None:
        return None
    return cause


def _info(lines: list[str]) -> tuple[Said, ...]:
    return tuple(Said(line) for line in lines)


def _failure_text(text: str, verdict: RoundVerdict | None, crash_loop: bool, ended: str) -> str:
    """The framed report, with why the job ended when not because of its round, and the
    crash loop's reason for not restarting."""
    text += f"\nphalanx: the job ended: {ended}" if ended else ""
    if crash_loop and verdict is not None:
        text += (
            f"\nphalanx: crash loop: the same failure twice in a row ({verdict.failure}) "
            "with no progress on any node in between (no checkpoint completed, no "
            "optimizer step or phalanx.step/heartbeat); not spending the remaining restarts."
        )
    return text


def _failure_error(cause: WorkerExit | None, event: JobEvent | None, ended: str) -> PhalanxError:
    """What a failed run raises: the root cause's exit code, or (no worker failed) a
    stopped job."""
    if cause is None:
        reason = ended or (describe_event(event) if event is not None else "")
        return RendezvousError(f"the job stopped: {reason or 'another node gave up'}")
    return JobFailed(f"{cause.who} on {cause.host}: {cause.summary}", cause.exit_code)


def _unnamed_hang(watch: RoundWatch, at: Round) -> bool:
    """A hang found here whose analysis names no suspect, in a job of several nodes: this
    node saw only its own ranks, and says nothing of a culprit until the job-wide analysis
    (``report.job``, with every node's stacks) can name one."""
    hang = watch.hang
    return hang is not None and not hang.suspects and at.result.num_nodes > 1
