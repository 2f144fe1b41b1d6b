"""Worker exits in their causal order, and the framed root-cause report."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence

from phalanx.supervisor.exits import WorkerExit


def causal_order(exits: Iterable[WorkerExit]) -> list[WorkerExit]:
    """The failures among ``exits``, the root cause first, ordered without comparing the
    clocks of different hosts (a host whose clock is behind would win any such comparison):

    1. a failure whose own evidence says a peer went away (``peer_error``: a Gloo peer reset)
       comes after every failure that does not -- it is collateral even when it was noticed
       and reported first;
    2. then the order the store saw them in (``seq``, an atomic counter taken when a node
       posted its failure). A node's other failed ranks, which it did not post (its cause was
       at least as early), take its cause's number;
    3. within one node, its monotonic clock.

    Where neither tells failures apart (no peer error, the same sequence number), only
    exits of one node remain tied, and its own clock orders them.
    """
    failures = [e for e in exits if e.failed]
    node_seq: dict[int, int] = {}
    for e in failures:
        if e.seq:
            node_seq[e.node_rank] = min(e.seq, node_seq.get(e.node_rank, e.seq))

    def key(e: WorkerExit) -> tuple[bool, float, int, float]:
        seq = e.seq or node_seq.get(e.node_rank) or math.inf  # inf: never posted (no store)
        return (e.peer_error, seq, e.node_rank, e.monotonic)

    return sorted(failures, key=key)


def root_cause(exits: Iterable[WorkerExit]) -> WorkerExit | None:
    """The first of ``causal_order``, or None when no worker failed on its own."""
    ordered = causal_order(exits)
    return ordered[0] if ordered else None


def format_report(
    exits: list[WorkerExit],
    attempts: int,
    width: int = 78,
    reason: str = "",
    details: Sequence[str] = (),
) -> str:
    """One framed summary: the root cause first (its kind in the header line), ``details``
    under it (a hang's analysis), then every other rank, marked as collateral."""
    cause = root_cause(exits)
    rule = "=" * width
    lines = [rule]
    if cause is None:
        lines.append(
            f"phalanx: job stopped after {attempts} attempt(s); no worker failed on its own"
        )
        if reason:
            lines.append(f"  reason: {reason}")
    else:
        lines += _cause_lines(cause, attempts)
    lines += [f"  {line}" for line in details]
    others = sorted((e for e in exits if e is not cause), key=lambda e: (e.node_rank, e.rank))
    if others:
        lines.append("-" * width)
        if cause is not None:
            lines.append("  collateral (stopped because of the root cause, or failed after it):")
        for other in others:
            if other.failed:
                state = f"also failed afterwards ({other.summary})"
            elif other.stopped_by_launcher:
                state = f"stopped by phalanx ({other.describe_exit()})"
            else:
                state = "finished (exit code 0)"
            lines.append(f"  {other.who} on {other.host} (node {other.node_rank}): {state}")
    lines.append(rule)
    return "\n".join(lines)


def _cause_lines(cause: WorkerExit, attempts: int) -> list[str]:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(cause.time))
    where = (
        f" ({cause.host})"
        if cause.kind == "node_lost"
        else f" on {cause.host} (node {cause.node_rank})"
    )
    kind = f" [{cause.kind}]" if cause.kind else ""
    lines = [
        f"phalanx: job failed after {attempts} attempt(s). Root cause: {cause.who}{where}{kind}"
    ]
    if cause.reason:
        lines.append(f"  {cause.reason}")
    if cause.kind == "node_lost":
        lines.append(f"  noticed at {when}")
        return lines
    how = cause.describe_exit()
    if cause.kind == "hang":
        how = f"then stopped by phalanx ({how})"
    lines.append(f"  pid {cause.pid}, {how}, at {when}")
    if cause.log_dir:
        lines.append(f"  logs: {cause.log_dir}")
    if cause.error_message and cause.error_message.strip() != cause.reason:
        lines.append(f"  error: {cause.error_message}")
    if cause.stderr_tail and cause.kind != "hang":
        lines.append("  last lines of its stderr (this error came from the worker, not phalanx):")
        lines += [f"    {line}" for line in cause.stderr_tail]
    return lines


def report_json(exits: list[WorkerExit], attempts: int, **extra: object) -> dict[str, object]:
    """``report.json``: the root cause with its kind, the collateral ranks, every exit."""
    cause = root_cause(exits)
    return {
        "attempts": attempts,
        "kind": cause.kind if cause is not None else None,
        "root_cause": cause.to_json() if cause is not None else None,
        "collateral": sorted(e.rank for e in exits if e is not cause and not e.failed),
        "also_failed": sorted(e.rank for e in exits if e is not cause and e.failed),
        **extra,
        "exits": [e.to_json() for e in exits],
    }
