"""Recovery figures from a run's events: per incident how long the job took to detect the
failure, stop its workers, re-form and get back to where it failed; and the run's ETTR.

**Progress** is a ``progress`` event: a rank's counters (its step and beats) as the agent
read them. The agent reads them on every tick of its loop (``--monitor-interval``, 0.1 s, with
several nodes; on a single node from 0.1 s to about once a second) and records them every
2 s when they moved, but at once when a rank first moves in an attempt and when its
step first reaches the failed attempt's highest step (``agent.attempt_events``), and once
more when the attempt ends. So a progress event's ``mono`` is, to a tick, when the agent
first saw that reading; its ``age`` says how long before that the agent's previous reading
was: ``mono - age`` is the earliest the rank's last move can have been, the **last
progress** of the figures (after a stop of the agent's own process, that is where the
agent last looked: what it did not see is not counted as progress). Events written before
``age`` was (every 2 s, no reading at once) give no last progress: their incidents begin
at the failure, as they did.

An **incident** is a ``failure`` event (a worker failure here, or the peer event that
stopped this node's workers: a peer's failure, a lost node, the store lost). It **begins**
at the earlier of the failure (its ``failed_at``: the worker's exit, a hung rank's last
progress; for a peer's, when this node heard of it, as the peer's stamp is on the peer's
clock) and this node's last progress in the failed round: the job stopped making progress
there, whether the agents saw the failure at once or only after a pause (a stopped store
host, a link down, a hang) -- never before the previous incident's end. Its parts, each
from recorded values only:

``detect``  from the incident's beginning to ``detected_at``, when this agent acted on it
            (None for a peer's failure in a round where this node reported no progress)
``stop``    the ``stopped`` event's ``seconds`` (every local worker gone, since detection)
``reform``  the next ``rdzv_done``'s ``t`` minus the ``stopped`` event's ``t``
``back``    from that ``rdzv_done`` to the first ``progress`` of the new round whose
            ``step`` reaches the failed round's highest step (when the failed round
            reported no step: the first progress of the new round, a beat or a step, as
            beats count from 0 in every attempt), or to the first ``worker_exit`` of the
            new round with exit code 0 (a worker that finished its work, also one that
            reported no progress: a script with no step, no beat); None if the new round
            never got there

``downtime`` runs from the incident's beginning to back at the step (the parts add up to
it). An incident the job never recovered from (no new round, the step never reached
again, or another failure first) counts as down until the next incident's beginning or
the end of the run, so no second is counted twice.

**ETTR** (effective training time ratio) is ``productive / wall``: ``wall`` runs from
``run_start`` to ``job_end`` (or ``now`` for a running job); ``startup`` from ``run_start`` to
the first progress (or to the first incident's beginning, if that came first); ``productive
= wall - startup - sum(downtime) - stalled``, where ``stalled`` is, for a job still running
(or one that did not succeed), the time since its ranks' last progress once that is over
``STALLED_AFTER`` and no incident counts it already: a hung job is not productive, and
once the ranks move again the gap was a slow step and counts again. Productive time is time
in which the workers were making progress that was not lost: before the first step
nothing trains, and after a failure the steps redone up to the failed one repeat work
already done once. The tail after the last step (saving, the exit barrier) counts as
productive: no event marks where training ended. A run whose workers never reported
progress (no optimizer step, ``phalanx.step``, ``phalanx.heartbeat``) has no ETTR (None):
nothing tells its startup from its training. Every boundary is good to one reading of the
counters, and never in the job's favour: startup and back end at the reading that saw the
move, an incident begins at the reading before the one that saw the last move.

Events of several nodes may be merged (``phalanx.events.read_run_events``): every figure
is per node. A node's events are those of its ``host`` whose ``seq`` count up from 0 (two
agents on one host are told apart by their ``seq`` chains and node ranks); the
run's ETTR is the lowest of its nodes' (training is synchronous: a node's lost time is the
job's). ``recovery(events, now)`` is pure; ``RecoveryTracker`` is the same fold fed one
event at a time (the agent's ``EventLog.listen``), keeping only what the figures need.
"""

from __future__ import annotations

from collections.abc import Iterable

from phalanx.events.fold import NodeFold
from phalanx.events.recovery_data import Event, Incident, NodeFigures, Recovery

__all__ = ["Incident", "NodeFigures", "Recovery", "RecoveryTracker", "recovery"]


def recovery(
    events: Iterable[Event], now: float | None = None, here: str | None = None
) -> Recovery:
    """The figures of ``events`` (one node's, or several merged); ``now``: where a run that
    has no ``job_end`` yet ends for now (default: its last event), on the events' own clock
    (``time.monotonic()`` for real events: their ``mono``). ``here``: the host ``now`` was
    read on; the nodes of other hosts end at their last event (their clocks are not ours)."""
    tracker = RecoveryTracker()
    for event in events:
        tracker.add(event)
    return tracker.result(now, here)


class RecoveryTracker:
    """``recovery`` one event at a time: ``add`` every event (in each node's order), then
    ``result``. Memory grows with nodes, rounds and incidents, never with progress samples."""

    def __init__(self) -> None:
        self._nodes: list[NodeFold] = []
        self._by_host: dict[str, list[NodeFold]] = {}

    def add(self, event: Event) -> None:
        self._stream(event).add(event)

    def result(self, now: float | None = None, here: str | None = None) -> Recovery:
        """The figures so far; ``now`` and ``here`` as in ``recovery``."""
        incidents: list[Incident] = []
        nodes = []
        for stream in self._nodes:
            found, figures = stream.figures(now if here is None or stream.host == here else None)
            incidents += found
            nodes.append(figures)
        incidents.sort(key=lambda i: (i.failed_at, i.host, i.node if i.node is not None else -1))
        restarts = max((s.restarts for s in self._nodes), default=0)
        return Recovery(tuple(incidents), tuple(nodes), restarts)

    def _stream(self, event: Event) -> NodeFold:
        """The node ``event`` belongs to: same host, and the ``seq`` chain it continues
        (``seq`` 0 starts a new one; a gap, from a torn line, joins the nearest below; of two
        chains at the same ``seq``, the one of the same node rank)."""
        host = str(event.get("host") or "")
        streams = self._by_host.setdefault(host, [])
        seq = event.get("seq")
        chosen: NodeFold | None = None
        if not isinstance(seq, int):
            chosen = streams[-1] if streams else None
        elif seq > 0:
            below = [s for s in streams if s.last_seq < seq]
            exact = [s for s in below if s.last_seq == seq - 1]
            # Two agents on one host, merged by time, may both continue here: the node rank,
            # once known, tells them apart.
            same = [s for s in exact if s.node is not None and s.node == event.get("node")]
            candidates = same or exact or sorted(below, key=lambda s: s.last_seq)
            chosen = candidates[-1] if candidates else None
        if chosen is None:
            chosen = NodeFold(host)
            streams.append(chosen)
            self._nodes.append(chosen)
        return chosen
