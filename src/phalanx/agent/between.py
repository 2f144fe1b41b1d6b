"""A job that ends between rounds: after a failed round, before the next forms (a node lost
meanwhile, the store with it; a worker that cannot start), or stopped while it waits. Each
still ends with a report (a ``RunEnd``), and the root cause of the last failed round is not
lost."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from phalanx.agent.describe import describe_event
from phalanx.agent.endings import Endings, unexplained
from phalanx.agent.runend import RunEnd, Said, with_checked
from phalanx.agent.sofar import RunState, SoFar
from phalanx.agent.stopped import stop_signal
from phalanx.errors import CutOff, Interrupted, PhalanxError, Preempted, RendezvousError
from phalanx.rendezvous.api import EventKind, JobEvent, RendezvousResult
from phalanx.report.exits import report_json
from phalanx.supervisor.exits import WorkerExit

# The hang analysis is read only after a hang (imported there): a type here.
if TYPE_CHECKING:
    from phalanx.hang.analysis import HangAnalysis

log = logging.getLogger("phalanx")


class Between:
    """The ends of a job between rounds (``agent.loop.Rounds`` reaches them), written with
    the run's ``Endings``."""

    def __init__(self, ends: Endings) -> None:
        self.ends = ends
        self.said_lost: set[str] = set()  # node ids of the nodes ``_say_lost`` told of

    def keep_failure(
        self,
        joined: RendezvousResult,
        exits: list[WorkerExit],
        event: JobEvent | None,
        hang: HangAnalysis | None,
    ) -> SoFar:
        """The failed round's report material, read now while the store is there: the job
        may end before the next round forms (a node lost meanwhile, the store with it)."""
        try:
            records = self.ends.round_records(
                joined, waiting_for_hangs=False, explain=unexplained(joined, exits, event)
            )
        except RendezvousError:
            records = []
        self._say_lost(joined, records, event)
        if (
            event is not None
            and event.kind is EventKind.PEER_FAILED
            and "returncode" in event.failure
        ):
            # The store may be gone already (its host went down after the failure): the event
            # that told of the failure carries its record.
            node = event.node_rank
            if all(r.get("node_rank") != node for r in records):
                records.append({**event.failure, "node_rank": node, "round": joined.round})
        return SoFar(joined, exits, event, hang, records)

    def _say_lost(
        self, joined: RendezvousResult, records: list[dict[str, object]], event: JobEvent | None
    ) -> None:
        """A ``node_lost`` event in this node's log for each node found gone from the round
        (from its record, or the event that stopped the round), once per node."""
        found = [r for r in records if r.get("kind") == "node_lost"]
        if event is not None and event.kind is EventKind.NODE_LOST and event.failure:
            found.append(event.failure)
        for record in found:
            node_id = record.get("node_id")
            if node_id in self.said_lost:
                continue
            self.said_lost.add(str(node_id))
            self.ends.events.emit(
                "node_lost",
                round=joined.round,
                lost_node=record.get("node_rank"),
                lost_host=record.get("hostname"),
                addr=record.get("addr"),
                node_id=node_id,
                reason=record.get("reason"),
            )

    def stopped_waiting(self, state: RunState, exc: Interrupted, where: str) -> RunEnd:
        """Asked to stop (``exc``) while waiting for a round or a verdict: tell the others,
        and end with the stop report (with the exits of the last failed round, if any)."""
        self.ends.tell_done(False, signum=exc.signum, preempted=isinstance(exc, Preempted))
        exits = state.failure.exits if state.failure is not None else []
        node = self.ends.events.node
        return self.ends.stopped(state, exits, exc.signum, node, exc.where or where, exc)

    def stop_heard(self) -> JobEvent | None:
        """A peer's ``JOB_STOPPED`` by a signal, once heard (``Peers.stop_heard``)."""
        peers = self.ends.rdzv.peers()
        return peers.stop_heard() if peers is not None else None

    def stopped_elsewhere(self, state: RunState, heard: JobEvent, signum: int) -> RunEnd:
        """Another node was stopped by ``signum`` and told the job (``heard``): tell the
        others this node is done, and end as stopped by that signal on that node, with the
        stop report (with the exits of the last failed round, if any)."""
        log.warning("%s", describe_event(heard))
        self.ends.tell_done(False)
        exits = state.failure.exits if state.failure is not None else []
        where = f"node {heard.node_rank}"
        error = Interrupted(signum, where)
        return self.ends.stopped(state, exits, signum, heard.node_rank, where, error)

    def cut_short(self, state: RunState, exc: PhalanxError, ended: str) -> RunEnd:
        """The job ends before a round could run (``ended``: why): the next round could not
        form, or a worker could not start. With a failed round before, its report, root
        cause and all; without, a report of ``ended`` alone, and ``exc`` raised. Once this
        node has heard that another was stopped by a signal, it ends as stopped by that
        signal, whatever cut it short here (that node hosted the store and left with it)."""
        heard = self.stop_heard()
        signum = stop_signal(heard)
        if heard is not None and signum is not None:
            log.info("%s", ended)
            return self.stopped_elsewhere(state, heard, signum)
        if isinstance(exc, CutOff):
            return self.cut_off(state, exc)
        if state.failure is not None:
            log.error("%s", ended)
            last = state.failure
            return self.ends.fail(
                state, last.joined, last.exits, last.event, last.hang, None,
                crash_loop=False, records=last.records, ended=ended,
            )  # fmt: skip
        self.ends.tell_done(False)
        _, figures = self.ends.recovery_figures()
        data = report_json(
            [], state.attempts, outcome="failed", reason=ended, ended=ended, recovery=figures
        )
        return RunEnd("failed", exc, (), with_checked(data, state.checked))

    def cut_off(self, state: RunState, exc: CutOff) -> RunEnd:
        """This node is out of the job, cut off from a quorum of its members (``exc``), while
        the others may go on: not the job's failure, so no job-wide report; its line last
        (``exc``, exit 79), the ``cut_off`` event, and ``report.json`` (outcome ``cut_off``)
        with the exits of its last round and why they were stopped."""
        self.ends.tell_done(False)
        last = state.failure
        event = last.event if last is not None else None
        self.ends.events.emit(
            "cut_off", round=last.joined.round if last is not None else None, reason=str(exc)
        )
        lines, figures = self.ends.recovery_figures()
        data = report_json(
            last.exits if last is not None else [], state.attempts, outcome="cut_off",
            reason=describe_event(event) if event is not None else str(exc), ended=str(exc),
            recovery=figures,
        )  # fmt: skip
        said = tuple(Said(line) for line in lines)
        return RunEnd("cut_off", exc, said, with_checked(data, state.checked))
