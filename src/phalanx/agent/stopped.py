"""A job asked to stop by a signal (``phalanx stop``, a scheduler's SIGTERM, Ctrl-C), on this
node or on another: how the agent tells, and the report it writes (pure functions); and the
reports of a job that succeeded and of a spare the job ended without."""

from __future__ import annotations

from phalanx.errors import signal_name
from phalanx.rendezvous.api import EventKind, JobEvent
from phalanx.report.exits import report_json
from phalanx.supervisor.exits import WorkerExit
from phalanx.supervisor.group import Outcome, RoundResult


def asked_to_stop(
    result: RoundResult, heard: JobEvent | None = None
) -> tuple[int, JobEvent | None] | None:
    """(the signal, None) when this node was asked to stop by a signal; (the signal, the
    ``JOB_STOPPED`` event) when another node was and told the job: the event that ended
    the round, or one ``heard`` (``Peers.stop_heard``) whatever ended it -- a worker that
    died with its peers, the store gone with the stopped node before this node polled.
    None otherwise."""
    if result.outcome is Outcome.INTERRUPTED:
        assert result.signum is not None
        return result.signum, None
    for event in (result.event, heard):
        signum = stop_signal(event)
        if signum is not None:
            return signum, event
    return None


def stop_signal(event: JobEvent | None) -> int | None:
    """The signal of a ``JOB_STOPPED`` of a node stopped by one; None for any other event."""
    if event is None or event.kind is not EventKind.JOB_STOPPED:
        return None
    signum = event.failure.get("signal")
    if isinstance(signum, int) and not isinstance(signum, bool):
        return signum
    return None


def stop_report(
    exits: list[WorkerExit],
    attempts: int,
    signum: int,
    node: int | None,
    where: str,
    recovery: dict[str, object] | None,
) -> dict[str, object]:
    """``report.json`` of a job stopped by ``signum`` on ``where`` (node ``node``): no root
    cause, every exit, the recovery figures so far."""
    name = signal_name(signum)
    return report_json(
        exits,
        attempts,
        outcome="interrupted",
        reason=f"stopped by {name} on {where}",
        signal=name,
        stopped_on_node=node,
        recovery=recovery,
    )


def success_report(
    exits: list[WorkerExit], attempts: int, recovery: dict[str, object] | None
) -> dict[str, object]:
    """``report.json`` of a job that succeeded: no root cause, no collateral, every exit and
    the recovery figures (None without an incident). Written at every success, not only
    after an incident: a script or a scheduler reads the outcome from it whatever the end."""
    data = report_json([], attempts, outcome="succeeded", recovery=recovery)
    return {**data, "exits": [e.to_json() for e in exits]}


def not_needed_report(why: str) -> dict[str, object]:
    """``report.json`` of a spare the job ended without (``NotNeeded``, exit 0): it ran no
    worker, so no attempt, no root cause, no exits; ``reason`` says why (its one line). The
    job's own outcome is its members' to report."""
    return report_json([], 0, outcome="not_needed", reason=why, recovery=None)
