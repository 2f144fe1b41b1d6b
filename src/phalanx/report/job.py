"""The job-wide failure report: every node's failures gathered through the rendezvous store,
classified; the first in causal order (``exits.causal_order``: peer errors last, then the
store's sequence numbers, never the hosts' clocks) is the root cause and every other rank
is collateral.

Failure records in the store are ``WorkerExit.to_json()`` (with ``kind`` and ``reason``),
plus ``"hang"`` (that node's ``HangAnalysis``) for a hang. A node that only dumped its
ranks because a peer found a hang posts ``{"hang": ...}`` alone, so the job-wide analysis
can place every rank. A node found gone from the round (lost, dead, or back as a new member
after losing the store) has a record of its own, ``{"kind": "node_lost", ...}``, posted by
whoever noticed (``phalanx.rendezvous.dynamic.lost``); ``record_exits`` reads it as a failure
of kind ``node_lost``, which comes before any rank that failed with a peer error. Where that
record was not read, the ``NODE_LOST`` event that stopped the round stands in for it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from phalanx.rendezvous.api import JobEvent, RendezvousResult
from phalanx.report.exits import format_report, report_json, root_cause
from phalanx.report.oom import OomProbe
from phalanx.supervisor.exits import WorkerExit
from phalanx.worker.contract import STACKS_FILE

# The hang analysis, the stacks and the classifier are imported where a failure reads them:
# the agent imports this module on every launch (a failure's report), most of which succeed.
if TYPE_CHECKING:
    from phalanx.hang.analysis import HangAnalysis, RankState


def classify_local(exits: Sequence[WorkerExit], probe: OomProbe) -> list[WorkerExit]:
    """Classify this node's exits, with the evidence only this node can read."""
    from phalanx.hang.stacks import fatal_frame
    from phalanx.report.classify import classify

    classified = []
    for e in exits:
        if e.failed and not e.kind:
            oom = probe.evidence(e.pid) if e.returncode == -signal.SIGKILL else ""
            fatal = fatal_frame(Path(e.log_dir) / STACKS_FILE) if e.returncode < 0 else ""
            e = classify(e, oom_evidence=oom, fatal_frame=fatal)
        classified.append(e)
    return classified


def _hang_reason(analysis: HangAnalysis, culprit: RankState) -> str:
    why = next((s.why for s in analysis.suspects if s.rank == culprit.rank), "")
    if not why:
        why = f"no rank stands out; idle longest, at {culprit.where}"
    return f"hung: no progress for {culprit.idle:.1f} s; {why}"


def blame_hang(
    exits: Sequence[WorkerExit], analysis: HangAnalysis, detected_at: float, seq: int = 0
) -> list[WorkerExit]:
    """Mark the culprit of ``analysis`` as the failure (kind ``hang``); clear any other hang
    mark (a node's own analysis may be overruled by the job-wide one). The culprit takes
    the hang's place in the job's order: its sequence number ``seq`` (``causal_order``)."""
    culprit = analysis.culprit
    marked = [replace(e, kind="", reason="", seq=0) if e.kind == "hang" else e for e in exits]
    for i, e in enumerate(marked):
        if e.rank == culprit.rank and e.node_rank == culprit.node_rank:
            reason = _hang_reason(analysis, culprit)
            marked[i] = replace(
                e, kind="hang", reason=reason, time=detected_at, seq=seq, peer_error=False
            )
            return marked
    marked.append(  # a rank of another node: build its record from what that node saw
        WorkerExit(
            rank=culprit.rank,
            local_rank=culprit.local_rank,
            host=culprit.host,
            pid=culprit.pid,
            returncode=-signal.SIGTERM,
            time=detected_at,
            stopped_by_launcher=True,
            log_dir=culprit.log_dir,
            node_rank=culprit.node_rank,
            kind="hang",
            reason=_hang_reason(analysis, culprit),
            seq=seq,
        )
    )
    return marked


def _lost_exit(
    first: int, count: int, host: str, node_rank: int, reason: str, when: float, seq: int = 0
) -> WorkerExit:
    ranks = f"rank {first}" if count == 1 else f"ranks {first}-{first + count - 1}"
    return WorkerExit(
        rank=first,
        local_rank=0,
        host=host,
        pid=0,
        returncode=0,
        time=when,
        stopped_by_launcher=False,
        label=f"node{node_rank}",
        node_rank=node_rank,
        kind="node_lost",
        reason=f"{reason}; its {ranks} went with it",
        seq=seq,
    )


def lost_exit(record: Mapping[str, object]) -> WorkerExit | None:
    """The failure of a node found gone from its round, from the record the rendezvous
    posted for it (``phalanx.rendezvous.dynamic.lost``); None for any other record."""
    if record.get("kind") != "node_lost":
        return None
    first, count = record.get("first_rank"), record.get("local_world_size")
    rank, seq, when = record.get("node_rank"), record.get("seq"), record.get("time")
    if not (isinstance(first, int) and isinstance(count, int) and isinstance(rank, int)):
        return None
    return _lost_exit(
        first, count, str(record.get("hostname", "?")), rank, str(record.get("reason", "")),
        float(when) if isinstance(when, (int, float)) else time.time(),
        seq if isinstance(seq, int) else 0,
    )  # fmt: skip


def record_exits(records: Sequence[Mapping[str, object]]) -> list[WorkerExit]:
    """The failures among the nodes' records of a round: workers' exits, and nodes found
    gone from it (``lost_exit``); records of a hang's whereabouts alone are left out. A node
    found lost counts once per round, by the first of its records in the store's order: its
    watcher and the node itself, back from a cut longer than ``heartbeat_timeout``, may
    both have posted one."""
    found = []
    told: set[tuple[object, object]] = set()  # (round, node id) of the lost nodes so far
    for r in records:
        if "returncode" in r and "rank" in r:
            found.append(WorkerExit.from_json(r))
        elif (lost := lost_exit(r)) is not None:
            key = (r.get("round"), r.get("node_id") or lost.node_rank)
            if key not in told:
                told.add(key)
                found.append(lost)
    return found


def lost_node(event: JobEvent, joined: RendezvousResult, describe: str) -> WorkerExit | None:
    """The failure of the node ``event`` (``NODE_LOST``) is about: from the record it
    carries, else from the round's membership (None if the node is not in the round)."""
    carried = lost_exit(event.failure)
    if carried is not None:
        return carried
    node = next((n for n in joined.nodes if n.node_rank == event.node_rank), None)
    if node is None:
        return None
    first = sum(n.local_world_size for n in joined.nodes if n.node_rank < node.node_rank)
    return _lost_exit(
        first, node.local_world_size, node.hostname, node.node_rank, describe, time.time()
    )


@dataclass(frozen=True)
class JobReport:
    text: str
    data: dict[str, object]
    cause: WorkerExit | None


def build(
    local: Sequence[WorkerExit],
    records: Sequence[Mapping[str, object]],
    attempts: int,
    *,
    local_hang: HangAnalysis | None,
    lost: WorkerExit | None,
    reason: str,
    extra: Mapping[str, object],
) -> JobReport:
    """One report from this node's exits and the other nodes' records of the same round."""
    from phalanx.hang.analysis import HangAnalysis, merge

    every = list(local) + record_exits(records)
    posted = [record.get("hang") for record in records]
    analyses = [HangAnalysis.from_json(hang) for hang in posted if isinstance(hang, dict)]
    if local_hang is not None:
        analyses.append(local_hang)
    job_hang = merge(analyses)
    cause = root_cause(every)
    if job_hang is not None and cause is not None and cause.kind == "hang":
        every = blame_hang(every, job_hang, cause.time, cause.seq)
    known = root_cause(every)
    if (
        lost is not None
        and (known is None or known.peer_error)
        and all(e.kind != "node_lost" or e.node_rank != lost.node_rank for e in every)
    ):
        every.append(lost)  # (its record was not read: posted late, or the store went)
    # A node found gone from the round is the cause ahead of any rank that failed only
    # because a peer went away (``causal_order``: peer errors last).
    cause = root_cause(every)
    if cause is not None and cause.kind == "node_lost" and not reason:
        reason = cause.reason
    details = job_hang.summary() if job_hang is not None and cause and cause.kind == "hang" else []
    text = format_report(every, attempts, reason=reason if cause is None else "", details=details)
    data = report_json(
        every,
        attempts,
        reason=reason,
        hang=job_hang.to_json() if job_hang is not None else None,
        **extra,
    )
    return JobReport(text, data, cause)
