"""The fold behind ``figures``: one node's events, in its order, to its incidents and its
run's figures (the definitions are in ``figures``).

Every duration is taken on the node's monotonic clock (an event's ``mono``; ``t`` only for
events that carry none): a wall clock that steps, or runs an hour ahead of another host's,
changes no figure. A wall stamp inside an event (``failed_at``, ``detected_at``) is moved
onto that clock by the event's own ``t - mono``; a peer's ``failed_at`` (another host's
clock) is not used for a duration at all."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from phalanx.events.recovery_data import DIGITS, STALLED_AFTER, Event, Incident, NodeFigures


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _r(value: float) -> float:
    return round(value, DIGITS)


@dataclass
class _Open:
    """An incident being followed through its recovery (stamps on the node's monotonic
    clock, but ``failed_wall``: the failure's wall time, for people and ordering).
    ``failed_at`` is where the incident began (``figures``: the failure, or this node's
    last progress before it if that was earlier); ``timed``: whether that is a time of this
    node's (else it is only when the node heard of a peer's failure)."""

    failure: Event
    failed_wall: float
    failed_at: float
    detected_at: float
    timed: bool
    target: tuple[str, int] | None  # the failed round's peak: ("step" | "beats", value)
    stop: float | None = None
    stopped_t: float | None = None
    new_round: int | None = None
    formed_t: float | None = None
    back_t: float | None = None
    cut_at: float | None = None  # the next incident began before this one recovered
    moved: str | None = None  # the store's failover during its recovery (``store_moved``)

    def finish(self, node: int | None, host: str, end: float) -> Incident:
        f = self.failure
        detect = self.detected_at - self.failed_at if self.timed else None
        reform = _span(self.stopped_t, self.formed_t)
        back = _span(self.formed_t, self.back_t)
        parts = [
            _r(max(0.0, p)) if p is not None else None for p in (detect, self.stop, reform, back)
        ]
        recovered = self.back_t is not None
        until = self.back_t if self.back_t is not None else self.cut_at
        downtime = max(0.0, (until if until is not None else end) - self.failed_at)
        target = None if self.target is None else f"{self.target[0]} {self.target[1]}"
        return Incident(
            node=node,
            host=host,
            round=f.get("round"),
            attempt=f.get("attempt"),
            failure_kind=f.get("failure_kind"),
            rank=f.get("rank"),
            failed_node=f.get("failed_node"),
            local=f.get("local") is True,
            failed_at=self.failed_wall,
            detect=parts[0],
            stop=parts[1],
            reform=parts[2],
            back=parts[3],
            target=target,
            downtime=_r(downtime),
            recovered=recovered,
            store_moved=self.moved,
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
    """Whether a progress event of the new round is "back": at the failed round's step, or
    (``target`` None) any progress made in the new round (a beat or a step)."""
    if target is None:
        beats = event.get("beats")
        return isinstance(event.get("step"), int) or (isinstance(beats, int) and beats > 0)
    value = event.get(target[0])
    return isinstance(value, int) and value >= target[1]


class NodeFold:
    """The fold over one node's events."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.node: int | None = None
        self.last_seq = -1
        self.began: float | None = None
        self.ended: float | None = None
        self.outcome: object = None  # job_end's
        self.last_progress: float | None = None  # the earliest the ranks' last move can be
        self.moved: dict[object, float] = {}  # round -> its last progress, from ``age``
        self.last_t: float | None = None
        self.first_progress: float | None = None
        self.peaks: dict[object, tuple[str, int]] = {}  # round -> its highest reading
        self.incidents: list[_Open] = []
        self.restarts = 0  # restarts and re-forms: rounds after a failure or a joining node
        self._on: dict[str, Callable[[Event, float], None]] = {
            "run_start": self._run_start,
            "failure": self._failure,
            "stopped": self._stopped,
            "rdzv_done": self._rdzv_done,
            "progress": self._progress,
            "worker_exit": self._worker_exit,
            "job_end": self._job_end,
            "store_moved": self._store_moved,
        }

    def add(self, event: Event) -> None:
        seq, wall, mono = event.get("seq"), _num(event.get("t")), _num(event.get("mono"))
        if isinstance(seq, int):
            self.last_seq = seq
        if isinstance(event.get("node"), int):
            self.node = event["node"]
        t = mono if mono is not None else wall
        if t is None:
            return
        if event.get("kind") in ("restart", "reform"):
            self.restarts += 1
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
        self.outcome = event.get("outcome")

    def _failure(self, event: Event, t: float) -> None:
        wall = _num(event.get("t"))
        shift = 0.0 if wall is None else wall - t  # this node's wall stamps onto ``t``'s clock
        detected = _num(event.get("detected_at"))
        detected = t if detected is None else detected - shift
        failed = _num(event.get("failed_at"))
        failed_wall = failed if failed is not None else detected + shift
        timed = event.get("local") is True and failed is not None
        # (a peer's stamp is on the peer's clock: when this node heard of it, then)
        failed = min(failed - shift, detected) if failed is not None and timed else detected
        moved = self.moved.get(event.get("round"))
        if moved is not None:  # the ranks stopped moving before the failure was seen
            failed, timed = min(failed, moved), True
        if self.incidents:  # no second counted twice: not before the last incident's end
            last = self.incidents[-1]
            failed = max(failed, last.back_t if last.back_t is not None else last.failed_at)
        if (previous := self._open) is not None:
            previous.cut_at = max(failed, previous.failed_at)
        target = self.peaks.get(event.get("round"))
        if target is not None and target[0] == "beats":
            target = None  # beats count from 0 in every attempt: back is any progress
        self.incidents.append(_Open(event, failed_wall, failed, detected, timed, target))

    def _stopped(self, event: Event, t: float) -> None:
        now = self._open
        if now is not None and now.stopped_t is None:
            now.stop, now.stopped_t = _num(event.get("seconds")), t

    def _store_moved(self, event: Event, t: float) -> None:
        now = self._open
        if now is not None:
            lost, successor = event.get("lost_host"), event.get("successor")
            now.moved = f"{lost} -> {successor} at {event.get('endpoint')}"

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
        age = _num(event.get("age"))
        moved = t - (age or 0.0)  # after the agent's previous reading
        last = self.last_progress
        self.last_progress = moved if last is None else max(moved, last)
        if age is not None:  # (an agent before ``age`` sampled every 2 s: moved when, unknown)
            self.moved[key] = max(moved, self.moved.get(key, moved))
        peak = self.peaks.get(key)
        if _higher(reading, peak):
            self.peaks[key] = reading
        now = self._open
        following = now is not None and now.formed_t is not None and key == now.new_round
        if following and now is not None and _reaches(event, now.target):
            now.back_t = t

    def _worker_exit(self, event: Event, t: float) -> None:
        """A worker of the new round that finished on its own (exit 0) did its work: the
        job is back, also when it reported no progress (no step, no beat) on the way."""
        now = self._open
        clean = event.get("returncode") == 0 and event.get("stopped_by_phalanx") is not True
        if not clean or now is None or now.formed_t is None:
            return
        if event.get("round") == now.new_round:
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
        stalled = 0.0
        if self.first_progress is not None:
            first_failure = min((i.failed_at for i in self.incidents), default=self.first_progress)
            startup = max(0.0, min(self.first_progress, first_failure) - began)
            stalled = self._stalled(end)
            productive = max(0.0, wall - startup - down - stalled)
            ettr = round(productive / wall, 4) if wall > 0 else None
        node = NodeFigures(
            node=self.node,
            host=self.host,
            wall=_r(wall),
            startup=None if startup is None else _r(startup),
            downtime=_r(down),
            productive=None if productive is None else _r(productive),
            ettr=ettr,
            stalled=_r(stalled),
        )
        return incidents, node

    def _stalled(self, end: float) -> float:
        """The time since the ranks last moved, once over ``STALLED_AFTER``, while no
        incident counts it already: a hung job is not productive. Only for a job that runs
        still or did not succeed: a successful one may well save and wait at the end."""
        if self._open is not None or self.last_progress is None or self.outcome == "succeeded":
            return 0.0
        since = end - self.last_progress
        return since if since > STALLED_AFTER else 0.0
