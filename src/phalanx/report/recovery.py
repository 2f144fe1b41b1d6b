"""The recovery figures (``phalanx.events.figures``) as the agent prints them at job end:
one line per incident, then the run's ETTR."""

from __future__ import annotations

from phalanx.events.figures import Incident, NodeFigures, Recovery

SAMPLING_NOTE = "good to the agent's readings of the progress counters"


def _s(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} s"


def _goal(target: str | None) -> str:
    """Where "back" is, in words: the failed attempt's highest step; "" (None): any progress
    in the new attempt (a script that reports no step: its beats count from 0 again)."""
    return target or ""


def _where(incident: Incident) -> str:
    """The failing rank's node; the node that saw it, when that is another one."""
    seen = f"{incident.host} (node {incident.node})" if incident.node is not None else incident.host
    failed = incident.failed_node
    if failed is None or failed == incident.node:
        return seen
    return f"node {failed} (as seen on {seen})"


def incident_line(number: int, incident: Incident) -> str:
    where = _where(incident)
    what = incident.failure_kind or "failure"
    if incident.rank is not None:
        what = f"rank {incident.rank} {what}"
    head = f"recovery: incident {number} (round {incident.round}), {what} on {where}: "
    goal = _goal(incident.target)
    regrouped = (
        f"the nodes regrouped in {_s(incident.reform)}"
        if incident.reform is not None
        else "the nodes never regrouped"
    )
    parts = f"noticed in {_s(incident.detect)}, workers stopped in {_s(incident.stop)}, {regrouped}"
    down = f"{incident.downtime:.2f} s down"
    if incident.recovered:
        back = f"back at {goal}" if goal else "making progress again"
        again = f"{goal} reached again" if goal else "progress again"
        return f"{head}{back} after {down} ({parts}, {again} in {_s(incident.back)})"
    never = f"never back at {goal}" if goal else "never made progress again"
    return f"{head}{never}; {down} ({parts})"


def ettr_line(recovery: Recovery, node: NodeFigures) -> str:
    count = len(recovery.incidents)
    lost = f"{node.downtime:.2f} s lost in {count} incident(s)"
    if node.ettr is None:
        return (
            "recovery: no ETTR: the workers reported no progress (no optimizer step, "
            f"phalanx.step or phalanx.heartbeat; {node.wall:.2f} s, {lost})"
        )
    stalled = f", {node.stalled:.2f} s without progress since" if node.stalled else ""
    return (
        f"recovery: ETTR {node.ettr:.2f} (the share of the run spent making progress): "
        f"{node.productive:.2f} s of {node.wall:.2f} s (startup {_s(node.startup)}, {lost}"
        f"{stalled}; {SAMPLING_NOTE})"
    )


def summary_lines(recovery: Recovery) -> list[str]:
    """Nothing when there was nothing to recover from (no incident, or no restart or re-form
    after it: the job just failed); else a line per incident and one per node's ETTR."""
    if not recovery.recovering:
        return []
    lines = [incident_line(n, i) for n, i in enumerate(recovery.incidents, 1)]
    return lines + [ettr_line(recovery, node) for node in recovery.nodes]
