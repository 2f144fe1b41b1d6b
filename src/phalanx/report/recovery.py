"""The recovery figures (``phalanx.events.figures``) as the agent prints them at job end:
one line per incident, then the run's ETTR."""

from __future__ import annotations

from phalanx.events.figures import Incident, NodeFigures, Recovery

SAMPLING_NOTE = "figures within about 2 s: progress is sampled every 2 s"


def _s(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} s"


def incident_line(number: int, incident: Incident) -> str:
    where = (
        f"{incident.host} (node {incident.node})" if incident.node is not None else incident.host
    )
    what = incident.failure_kind or "failure"
    if incident.rank is not None:
        what = f"rank {incident.rank} {what}"
    head = f"recovery: incident {number}, round {incident.round}, {what} on {where}: "
    target = incident.target or "the first progress"
    if incident.recovered:
        parts = (
            f"detect {_s(incident.detect)} + stop {_s(incident.stop)} + re-form "
            f"{_s(incident.reform)} + back at {target} in {_s(incident.back)}"
        )
        return f"{head}{parts} = {incident.downtime:.2f} s down"
    return (
        f"{head}never back at {target} (detect {_s(incident.detect)}, stop "
        f"{_s(incident.stop)}, re-form {_s(incident.reform)}): {incident.downtime:.2f} s down"
    )


def ettr_line(recovery: Recovery, node: NodeFigures) -> str:
    count = len(recovery.incidents)
    if node.ettr is None:
        return (
            f"recovery: no ETTR: the workers reported no progress ({node.wall:.2f} s wall, "
            f"{node.downtime:.2f} s down in {count} incident(s))"
        )
    return (
        f"recovery: ETTR {node.ettr:.2f}: {node.productive:.2f} s productive of {node.wall:.2f} s "
        f"wall (startup {_s(node.startup)}, {node.downtime:.2f} s down in {count} "
        f"incident(s); {SAMPLING_NOTE})"
    )


def summary_lines(recovery: Recovery) -> list[str]:
    """Nothing when there was no incident; else a line per incident and one per node's ETTR."""
    if not recovery.incidents:
        return []
    lines = [incident_line(n, i) for n, i in enumerate(recovery.incidents, 1)]
    return lines + [ettr_line(recovery, node) for node in recovery.nodes]
