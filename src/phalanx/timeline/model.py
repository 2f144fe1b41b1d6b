"""A run's events (``phalanx.events``) as a timeline: plain frozen data for the page and the
terminal summary.

One lane per global rank, grouped by the node (rank in the round, and host) that ran it last.
Times are the events' wall clock ``t`` (for pictures: the nodes' clocks are not compared
here). Each node's agent writes its own stream of events; a gathered run holds several, one
after the other, each numbered from ``seq`` 0, which is how they are told apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

Event = dict[str, Any]


@dataclass(frozen=True)
class Group:
    """The ranks one node ran (in their last attempt)."""

    node: int | None
    host: str
    ranks: tuple[int, ...]

    @property
    def label(self) -> str:
        return f"node {self.node if self.node is not None else '?'} \u00b7 {self.host}"


@dataclass(frozen=True)
class Attempt:
    """One rank's run in one attempt. ``outcome``: succeeded, failed, stopped (by phalanx,
    after another rank failed) or running (no exit recorded)."""

    rank: int
    attempt: int  # as users see it: its log directory's number (attempt_<restart count>)
    round: int | None
    start: float
    end: float
    outcome: str
    returncode: int | None
    pid: int | None
    steps: tuple[tuple[float, int], ...]  # (t, step) samples within the attempt
    formed: float | None = None  # when its round formed (from then to ``start``: starting)


@dataclass(frozen=True)
class Wait:
    """One node's wait at the rendezvous; ``round`` None: it never formed."""

    group: tuple[int | None, str]  # (node, host) the wait is drawn under
    start: float
    end: float
    round: int | None
    num_nodes: int | None
    world_size: int | None


@dataclass(frozen=True)
class Mark:
    """A failure or a hang at one moment: on a rank's lane, or on a node's band when the
    rank is not known."""

    kind: str  # failure: its failure_kind (exit_code, signal, oom, ...); hang: "hang"
    t: float
    rank: int | None
    group: tuple[int | None, str]
    detail: str


@dataclass(frozen=True)
class Restart:
    t: float
    restart: int
    max_restarts: int | None


@dataclass(frozen=True)
class Timeline:
    run_id: str | None
    start: float
    end: float
    groups: tuple[Group, ...]
    attempts: tuple[Attempt, ...]
    waits: tuple[Wait, ...]
    failures: tuple[Mark, ...]
    hangs: tuple[Mark, ...]
    restarts: tuple[Restart, ...]
    outcome: str | None  # job_end's outcome (None: still running, or the agent was killed)
    exit_code: int | None
    stragglers: tuple[Mark, ...] = ()  # kind "straggler", on the rank's lane

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(rank for group in self.groups for rank in group.ranks)


def streams(events: Sequence[Event]) -> Iterator[list[Event]]:
    """Split a run's events into each agent's own stream (each numbered from seq 0)."""
    current: list[Event] = []
    for event in events:
        seq = event.get("seq")
        if current and isinstance(seq, int) and seq <= int(current[-1].get("seq", -1)):
            yield current
            current = []
        current.append(event)
    if current:
        yield current


def build(events: Sequence[Event]) -> Timeline:
    """The timeline of ``events`` (``read_events``/``read_run_events`` order)."""
    times = [float(e["t"]) for e in events if isinstance(e.get("t"), (int, float))]
    start, end = (min(times), max(times)) if times else (0.0, 0.0)
    attempts: list[Attempt] = []
    waits: list[Wait] = []
    homes: dict[int, tuple[float, int | None, str]] = {}  # rank -> (t, node, host) last start
    labels = _attempt_labels(events)
    for stream in streams(events):
        attempts.extend(_attempts(stream, end, labels))
        waits.extend(_waits(stream, end))
        for e in _of(stream, "workers_started"):
            for rank in e.get("ranks") or ():
                if rank not in homes or homes[rank][0] <= e["t"]:
                    homes[rank] = (e["t"], e.get("node"), str(e.get("host")))
    ends = [e for e in events if e["kind"] == "job_end"]
    runs = [e for e in events if e["kind"] == "run_start"]
    return Timeline(
        run_id=runs[0].get("run_id") if runs else None,
        start=start,
        end=end,
        groups=_groups(homes),
        attempts=tuple(sorted(attempts, key=lambda a: (a.rank, a.start))),
        waits=tuple(waits),
        failures=_failures(events, labels),
        hangs=tuple(_hangs(events)),
        stragglers=tuple(_stragglers(events)),
        restarts=_restarts(events),
        outcome=ends[-1].get("outcome") if ends else None,
        exit_code=ends[-1].get("exit_code") if ends else None,
    )


def _of(stream: Iterable[Event], kind: str) -> list[Event]:
    return [e for e in stream if e.get("kind") == kind]


def _attempt_labels(events: Sequence[Event]) -> dict[object, int]:
    """Round -> the number users see for its attempt: the job's restart count then, as the
    attempt's log directory ``attempt_<restart count>`` is named (the first is 0)."""
    return {
        e.get("round"): e["restart_count"]
        for e in _of(events, "rdzv_done")
        if isinstance(e.get("restart_count"), int)
    }


def _label(event: Event, labels: dict[object, int]) -> int:
    """``event``'s attempt as users see it (the events count a node's attempts from 1)."""
    found = labels.get(event.get("round"))
    number = event.get("attempt")
    return found if found is not None else int(number) - 1 if isinstance(number, int) else 0


def _groups(homes: dict[int, tuple[float, int | None, str]]) -> tuple[Group, ...]:
    by_node: dict[tuple[int | None, str], list[int]] = {}
    for rank, (_, node, host) in sorted(homes.items()):
        by_node.setdefault((node, host), []).append(rank)
    keys = sorted(by_node, key=lambda k: (k[0] is None, k[0] or 0, k[1]))
    return tuple(Group(node, host, tuple(by_node[(node, host)])) for node, host in keys)


def _attempts(stream: list[Event], end: float, labels: dict[object, int]) -> Iterator[Attempt]:
    exits = {(e.get("attempt"), e.get("rank")): e for e in _of(stream, "worker_exit")}
    progress = _of(stream, "progress")
    formed = {e.get("attempt"): float(e["t"]) for e in _of(stream, "rdzv_done")}
    for started in _of(stream, "workers_started"):
        number = started.get("attempt")
        pids = list(started.get("pids") or ())
        for i, rank in enumerate(started.get("ranks") or ()):
            done = exits.get((number, rank))
            stop = float(done["t"]) if done is not None else end
            steps = tuple(
                (float(p["t"]), int(p["step"]))
                for p in progress
                if p.get("rank") == rank and p.get("step") is not None
                if started["t"] <= p["t"] <= stop
            )
            yield Attempt(
                rank=rank,
                attempt=_label(started, labels),
                round=started.get("round"),
                start=float(started["t"]),
                end=stop,
                outcome=_outcome(done),
                returncode=done.get("returncode") if done is not None else None,
                pid=pids[i] if i < len(pids) else None,
                steps=steps,
                formed=formed.get(number),
            )


def _outcome(done: Event | None) -> str:
    if done is None:
        return "running"
    if done.get("failed"):
        return "failed"
    if done.get("stopped_by_phalanx"):
        return "stopped"
    return "succeeded" if done.get("returncode") == 0 else "failed"


def _waits(stream: list[Event], end: float) -> Iterator[Wait]:
    began: Event | None = None
    for e in stream:
        if e["kind"] == "rdzv_start":
            began = e
        elif e["kind"] == "rdzv_done" and began is not None:
            yield Wait(
                (e.get("node"), str(e.get("host"))), float(began["t"]), float(e["t"]),
                e.get("round"), e.get("num_nodes"), e.get("world_size"),
            )  # fmt: skip
            began = None
    if began is not None:  # still waiting, or the wait failed
        yield Wait((began.get("node"), str(began.get("host"))), float(began["t"]), end,
                   None, None, None)  # fmt: skip


def _failures(events: Sequence[Event], labels: dict[object, int]) -> tuple[Mark, ...]:
    """Each node records the failure it acted on: the failing node's own record (``local``)
    names the root cause; a peer's record is shown only when no local one exists for its
    round (the failing node's events were not gathered)."""
    failures = _of(events, "failure")
    local_rounds = {e.get("round") for e in failures if e.get("local")}
    marks = []
    for e in failures:
        if not e.get("local") and e.get("round") in local_rounds:
            continue
        when = e.get("failed_at") or e.get("detected_at") or e["t"]
        kind = str(e.get("failure_kind") or "unknown")
        code = f", exit code {e['exit_code']}" if e.get("exit_code") is not None else ""
        rank = e.get("rank")
        who = f"rank {rank}" if rank is not None else "a peer"
        detail = f"{kind}: {who}{code} (attempt {_label(e, labels)}): {e.get('reason') or ''}"
        marks.append(Mark(kind, float(when), rank, (e.get("node"), str(e.get("host"))), detail))
    return tuple(marks)


def _hangs(events: Sequence[Event]) -> Iterator[Mark]:
    for e in _of(events, "hang"):
        suspects = ", ".join(str(s) for s in e.get("suspects") or ()) or "none"
        for rank in e.get("ranks") or ():
            detail = f"hang: rank {rank} made no progress (suspects: {suspects})"
            yield Mark("hang", float(e["t"]), rank, (e.get("node"), str(e.get("host"))), detail)


def _stragglers(events: Sequence[Event]) -> Iterator[Mark]:
    """Every node names the same straggler: one mark per round and rank, the earliest."""
    seen: set[tuple[object, object]] = set()
    for e in sorted(_of(events, "straggler"), key=lambda e: float(e["t"])):
        if (e.get("round"), e.get("rank")) in seen:
            continue
        seen.add((e.get("round"), e.get("rank")))
        detail = (
            f"straggler: rank {e.get('rank')} on node {e.get('straggler_node')} "
            f"({e.get('straggler_host')}) at {e.get('rate')} steps/s, the others' median "
            f"{e.get('median')} (--straggler-action {e.get('action')})"
        )
        group = (e.get("straggler_node"), str(e.get("straggler_host")))
        yield Mark("straggler", float(e["t"]), e.get("rank"), group, detail)


def _restarts(events: Sequence[Event]) -> tuple[Restart, ...]:
    """One per restart spent (every node records the same one: the earliest is kept)."""
    first: dict[int, Restart] = {}
    for e in _of(events, "restart"):
        number = int(e.get("restart") or 0)
        if number not in first or e["t"] < first[number].t:
            first[number] = Restart(float(e["t"]), number, e.get("max_restarts"))
    return tuple(first[n] for n in sorted(first))
