"""The job-wide failure report: every node's failures gathered through the rendezvous store,
classified; the first in causal order (``exits.causal_order``: peer errors last, then the
store's sequence numbers, never the hosts' clocks) is the root cause and every other rank
is collateral.

Failure records in the store are ``WorkerExit.to_json()`` (with ``kind`` and ``reason``),
plus ``"hang"`` (that node's ``HangAnalysis``) for a hang. A node that only dumped its
ranks because a peer found a hang posts ``{"hang": ...}`` alone, so the job-wide analysis
can place every rank. A lost node has no record: the report makes one from the event.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from phalanx.hang.analysis import HangAnalysis, RankState, merge
from phalanx.hang.stacks import fatal_frame
from phalanx.rendezvous.api import JobEvent, RendezvousResult
from phalanx.report.classify import classify
from phalanx.report.exits import format_report, report_json, root_cause
from phalanx.report.oom import OomProbe
from phalanx.supervisor.exits import WorkerExit
from phalanx.worker.contract import STACKS_FILE


def classify_local(exits: Sequence[WorkerExit], probe: OomProbe) -> list[WorkerExit]:
    """Classify this node's exits, with the evidence only this node can read."""
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


def lost_node(event: JobEvent, joined: RendezvousResult, describe: str) -> WorkerExit | None:
    """The failure record of a node that stopped heartbeating (None if it is not in the round)."""
    node = next((n for n in joined.nodes if n.node_rank == event.node_rank), None)
    if node is None:
        return None
    first = sum(n.local_world_size for n in joined.nodes if n.node_rank < node.node_rank)
    ranks = (
        f"rank {first}"
        if node.local_world_size == 1
        else (f"ranks {first}-{first + node.local_world_size - 1}")
    )
    return WorkerExit(
        rank=first,
        local_rank=0,
        host=node.hostname,
        pid=0,
        returncode=0,
        time=time.time(),
        stopped_by_launcher=False,
        label=f"node{node.node_rank}",
        node_rank=node.node_rank,
        kind="node_lost",
        reason=f"{describe}; its {ranks} went with it",
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
    every = list(local) + [
        WorkerExit.from_json(r) for r in records if "returncode" in r and "rank" in r
    ]
    analyses = []
    for record in records:
        posted = record.get("hang")
        if isinstance(posted, dict):
            analyses.append(HangAnalysis.from_json(posted))
    if local_hang is not None:
        analyses.append(local_hang)
    job_hang = merge(analyses)
    cause = root_cause(every)
    if job_hang is not None and cause is not None and cause.kind == "hang":
        every = blame_hang(every, job_hang, cause.time, cause.seq)
    if root_cause(every) is None and lost is not None:
        every.append(lost)
    cause = root_cause(every)
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
