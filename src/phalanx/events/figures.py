"""Recovery figures from a run's events: per incident how long the job took to detect the
failure, stop its workers, re-form and get back to where it failed; and the run's ETTR.

An **incident** is a ``failure`` event (a worker failure here, or the peer event that
stopped this node's workers: a peer's failure, a lost node, a node waiting to join). Its
four parts, each from recorded values only:

``detect``  ``detected_at - failed_at`` of the failure (None when ``failed_at`` is unknown)
``stop``    the ``stopped`` event's ``seconds`` (every local worker gone, since detection)
``reform``  the next ``rdzv_done``'s ``t`` minus the ``stopped`` event's ``t``
``back``    from that ``rdzv_done`` to the first ``progress`` of the new round whose
            ``step`` reaches the failed round's highest step (``beats`` when the failed
            round reported no step; any progress when it reported none at all); None if
            the new round never got there

``downtime`` is the sum of the parts there are (that is, from ``failed_at`` to back at the
step). An incident the job never recovered from (no new round, the step never reached
again, or another failure first) counts as down until the next incident's ``failed_at`` or
the end of the run, so no second is counted twice.

**ETTR** (effective training time ratio) is ``productive / wall``: ``wall`` runs from
``run_start`` to ``job_end`` (or ``now`` for a running job); ``startup`` from ``run_start`` to
the first ``progress`` (or to the first incident, if that came first); ``productive = wall -
startup - sum(downtime)``. Productive time is time in which the workers were making progress
that was not lost: before the first step nothing trains, and after a failure the steps
redone up to the failed one repeat work already done once. The tail after the last step
(saving, the exit barrier) counts as productive: no event marks where training ended. A run
whose workers never reported progress has no ETTR (None). ``progress`` is sampled every 2 s
per rank (``attempt.PROGRESS_EVERY``), so ``back``, ``startup`` and the ETTR are good to
about 2 s.

Events of several nodes may be merged (``phalanx.events.read_run_events``): every figure
is per node. A node's events are those of its ``host`` whose ``seq`` count up from 0 (two
agents on one host are told apart by their ``seq`` chains and node ranks); the
run's ETTR is the lowest of its nodes' (training is synchronous: a node's lost time is the
job's). ``recovery(events, now)`` is pure; ``RecoveryTracker`` is the same fold fed one
event at a time (the agent's ``EventLog.listen``), keeping only what the figures need.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Event = Mapping[str, Any]
_DIGITS = 3  # figures are rounded to the millisecond (events are stamped to the microsecond)


@dataclass(frozen=True)
class Incident:
    """One failure as one node saw it, with its recovery (seconds; None: not known)."""

    node: int | None
    host: str
    round: int | None
    attempt: int | None
    failure_kind: str | None
    rank: int | None
    local: bool  # this node's own failure (else a peer's, or a lost node, as it heard)
    failed_at: float
    detect: float | None
    stop: float | None
    reform: float | None
    back: float | None
    target: str | None  # what "back" means: "step 41", "beats 9", or None (any progress)
    downtime: float
    recovered: bool

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class NodeFigures:
    """One node's run as a whole (seconds; ``ettr`` None: its workers reported no progress)."""

    node: int | None
    host: str
    wall: float
    startup: float | None
    downtime: float
    productive: float | None
    ettr: float | None

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class Recovery:
    incidents: tuple[Incident, ...]
    nodes: tuple[NodeFigures, ...]

    @property
    def ettr(self) -> float | None:
        """The run's: the lowest of its nodes' (None when no node has one)."""
        known = [n.ettr for n in self.nodes if n.ettr is not None]
        return min(known) if known else None

    def to_json(self) -> dict[str, Any]:
        return {
            "ettr": self.ettr,
            "incidents": [i.to_json() for i in self.incidents],
            "nodes": [n.to_json() for n in self.nodes],
        }


def recovery(events: Iterable[Event], now: float | None = None) -> Recovery:
    """The figures of ``events`` (one node's, or several merged); ``now``: where a run that
    has no ``job_end`` yet ends for now (default: its last event)."""
    tracker = RecoveryTracker()
    for event in events:
        tracker.add(event)
    return tracker.result(now)


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _r(value: float) -> float:
    return round(value, _DIGITS)


@dataclass
class _Open:
    """An incident being followed through its recovery (wall-clock stamps)."""

    failure: Event
    failed_at: float
    detected_at: float
    target: tuple[str, int] | None  # the failed round's peak: ("step" | "beats", value)
    stop: float | None = None
    stopped_t: float | None = None
    new_round: int | None = None
    formed_t: float | None = None
    back_t: float | None = None
    cut_at: float | None = None  # the next incident began before this one recovered

    def finish(self, node: int | None, host: str, end: float) -> Incident:
        f = self.failure
        detect = None if _num(f.get("failed_at")) is None else self.detected_at - self.failed_at
        reform = _span(self.stopped_t, self.formed_t)
        back = _span(self.formed_t, self.back_t)
        parts = [
            _r(max(0.0, p)) if p is not None else None for p in (detect, self.stop, reform, back)
        ]
        recovered = back is not None
        if recovered:
            downtime = sum(p for p in parts if p is not None)
        else:
            downtime = max(0.0, (self.cut_at if self.cut_at is not None else end) - self.failed_at)
        target = None if self.target is None else f"{self.target[0]} {self.target[1]}"
        return Incident(
            node=node,
            host=host,
            round=f.get("round"),
            attempt=f.get("attempt"),
            failure_kind=f.get("failure_kind"),
            rank=f.get("rank"),
            local=f.get("local") is True,
            failed_at=self.failed_at,
            detect=parts[0],
            stop=parts[1],
            reform=parts[2],
            back=parts[3],
            target=target,
            downtime=_r(downtime),
            recovered=recovered,
        )


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


def _reading(event: Event) -> tuple[str, int] | None:
    """A progress event's position: its step when it reports one, else its beats."""
    step, beats = event.get("step"), event.get("beats")
    if isinstance(step, int):
        return "step", step
    return ("beats", beats) if isinstance(beats, int) else None


def _higher(reading: tuple[str, int], peak: tuple[str, int] | None) -> bool:
    """Whether ``reading`` is the round's new peak (a step outranks any count of beats)."""
    if peak is None or (reading[0], peak[0]) == ("step", "beats"):
        return True
    return reading[0] == peak[0] and reading[1] > peak[1]


def _reaches(event: Event, target: tuple[str, int] | None) -> bool:
    if target is None:
        return True
    value = event.get(target[0])
    return isinstance(value, int) and value >= target[1]


class _Node:
    """The fold over one node's events."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.node: int | None = None
        self.last_seq = -1
        self.began: float | None = None
        self.ended: float | None = None
        self.last_t: float | None = None
        self.first_progress: float | None = None
        self.peaks: dict[object, tuple[str, int]] = {}  # round -> its highest reading
        self.incidents: list[_Open] = []
        self._on: dict[str, Callable[[Event, float], None]] = {
            "run_start": self._run_start,
            "failure": self._failure,
            "stopped": self._stopped,
            "rdzv_done": self._rdzv_done,
            "progress": self._progress,
            "job_end": self._job_end,
        }

    def add(self, event: Event) -> None:
        seq, t = event.get("seq"), _num(event.get("t"))
        if isinstance(seq, int):
            self.last_seq = seq
        if isinstance(event.get("node"), int):
            self.node = event["node"]
        if t is None:
            return
        self.last_t = t
        if self.began is None:
            self.began = t
        on = self._on.get(str(event.get("kind")))
        if on is not None:
            on(event, t)

    @property
    def _open(self) -> _Open | None:
        last = self.incidents[-1] if self.incidents else None
        return last if last is not None and last.back_t is None and last.cut_at is None else None

    def _run_start(self, event: Event, t: float) -> None:
        self.began = t

    def _job_end(self, event: Event, t: float) -> None:
        self.ended = t

    def _failure(self, event: Event, t: float) -> None:
        detected = _num(event.get("detected_at"))
        detected = t if detected is None else detected
        failed = _num(event.get("failed_at"))
        failed = detected if failed is None else min(failed, detected)
        if (previous := self._open) is not None:
            previous.cut_at = max(failed, previous.failed_at)
        target = self.peaks.get(event.get("round"))
        self.incidents.append(_Open(event, failed, detected, target))

    def _stopped(self, event: Event, t: float) -> None:
        now = self._open
        if now is not None and now.stopped_t is None:
            now.stop, now.stopped_t = _num(event.get("seconds")), t

    def _rdzv_done(self, event: Event, t: float) -> None:
        now = self._open
        if now is not None and now.stopped_t is not None and now.formed_t is None:
            now.formed_t, now.new_round = t, event.get("round")

    def _progress(self, event: Event, t: float) -> None:
        reading = _reading(event)
        if reading is None:
            return
        if self.first_progress is None:
            self.first_progress = t
        key = event.get("round")
        peak = self.peaks.get(key)
        if _higher(reading, peak):
            self.peaks[key] = reading
        now = self._open
        following = now is not None and now.formed_t is not None and key == now.new_round
        if following and now is not None and _reaches(event, now.target):
            now.back_t = t

    def figures(self, now: float | None) -> tuple[list[Incident], NodeFigures]:
        last = self.ended if self.ended is not None else now if now is not None else self.last_t
        began = self.began if self.began is not None else (last or 0.0)
        end = began if last is None else max(last, began)
        incidents = [i.finish(self.node, self.host, end) for i in self.incidents]
        wall = end - began
        down = sum(i.downtime for i in incidents)
        startup: float | None = None
        productive = ettr = None
        if self.first_progress is not None:
            first_failure = min((i.failed_at for i in incidents), default=self.first_progress)
            startup = max(0.0, min(self.first_progress, first_failure) - began)
            productive = max(0.0, wall - startup - down)
            ettr = round(productive / wall, 4) if wall > 0 else None
        node = NodeFigures(
            node=self.node,
            host=self.host,
            wall=_r(wall),
            startup=None if startup is None else _r(startup),
            downtime=_r(down),
            productive=None if productive is None else _r(productive),
            ettr=ettr,
        )
        return incidents, node


class RecoveryTracker:
    """``recovery`` one event at a time: ``add`` every event (in each node's order), then
    ``result``. Memory grows with nodes, rounds and incidents, never with progress samples."""

    def __init__(self) -> None:
        self._nodes: list[_Node] = []
        self._by_host: dict[str, list[_Node]] = {}

    def add(self, event: Event) -> None:
        self._stream(event).add(event)

    def result(self, now: float | None = None) -> Recovery:
        incidents: list[Incident] = []
        nodes = []
        for stream in self._nodes:
            found, figures = stream.figures(now)
            incidents += found
            nodes.append(figures)
        incidents.sort(key=lambda i: (i.failed_at, i.host, i.node if i.node is not None else -1))
        return Recovery(tuple(incidents), tuple(nodes))

    def _stream(self, event: Event) -> _Node:
        """The node ``event`` belongs to: same host, and the ``seq`` chain it continues
        (``seq`` 0 starts a new one; a gap, from a torn line, joins the nearest below; of two
        chains at the same ``seq``, the one of the same node rank)."""
        host = str(event.get("host") or "")
        streams = self._by_host.setdefault(host, [])
        seq = event.get("seq")
        chosen: _Node | None = None
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
            chosen = _Node(host)
            streams.append(chosen)
            self._nodes.append(chosen)
        return chosen
