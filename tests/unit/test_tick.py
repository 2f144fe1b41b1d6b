"""The round's tick (``phalanx.tick``): one reading of every rank's progress counters per tick,
fed to the watchers in order, and watchers that decide from that reading on their own
schedule. Pure: counters written as plain files, fake watchers, a fake clock."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from phalanx.agent.attempt_events import PROGRESS_EVERY, AttemptEvents
from phalanx.events.log import EventLog
from phalanx.status.node import NodeStatus
from phalanx.tick import Reading, Watchers
from phalanx.worker import progress


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class Seen:
    """A watcher that keeps what it saw and answers ``stop``."""

    def __init__(self, order: list[str], name: str, stop: bool = False) -> None:
        self.order, self.name, self.stop = order, name, stop
        self.readings: list[Reading] = []

    def see(self, reading: Reading) -> bool:
        self.order.append(self.name)
        self.readings.append(reading)
        return self.stop


def workers(tmp: Path, count: int) -> list[Any]:
    found = []
    for rank in range(count):
        (tmp / str(rank)).mkdir()
        found.append(SimpleNamespace(global_rank=rank, local_rank=rank, log_dir=tmp / str(rank)))
    return found


def bump(worker: Any, beats: int, step: int) -> None:
    (worker.log_dir / progress.FILE_NAME).write_bytes(progress.LAYOUT.pack(beats, step))


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every read of a progress counter, by path."""
    paths: list[str] = []
    real = progress.read_counters

    def counted(path: str) -> tuple[int, int, int] | None:
        paths.append(path)
        return real(path)

    monkeypatch.setattr(progress, "read_counters", counted)
    return paths


def test_each_tick_reads_every_rank_once_and_every_watcher_sees_that_reading(
    tmp_path: Path, reads: list[str]
) -> None:
    plan = workers(tmp_path, 3)
    for rank, worker in enumerate(plan):
        bump(worker, 10 + rank, rank)
    order: list[str] = []
    first, second = Seen(order, "first"), Seen(order, "second")
    clock = Clock()
    tick = Watchers(plan, [first, second], clock)
    running = [(plan[0], 100), (plan[1], 101)]  # rank 2 ended: still read
    assert not tick(running)
    assert len(reads) == 3 and order == ["first", "second"]
    (reading,) = first.readings
    assert second.readings == [reading] and second.readings[0] is reading
    assert reading.at == 50.0 and reading.running == tuple(running)
    assert reading.counters == {0: (10, 0), 1: (11, 1), 2: (12, 2)}
    clock.now += 1.0
    bump(plan[0], 20, 5)
    assert not tick(running)
    assert len(reads) == 6 and order == ["first", "second"] * 2
    assert first.readings[1].at == 51.0 and first.readings[1].counters[0] == (20, 5)


def test_the_first_watcher_to_stop_the_round_is_the_last_to_see_the_reading(
    tmp_path: Path, reads: list[str]
) -> None:
    plan = workers(tmp_path, 1)
    order: list[str] = []
    watchers = [Seen(order, "events"), Seen(order, "hang", stop=True), Seen(order, "slow")]
    assert Watchers(plan, watchers, Clock())([(plan[0], 100)])
    assert order == ["events", "hang"] and len(reads) == 1


def test_ranks_without_counters_are_left_out_and_the_last_step_skips_no_step(
    tmp_path: Path,
) -> None:
    plan = workers(tmp_path, 3)
    bump(plan[0], 4, progress.NO_STEP)
    bump(plan[1], 9, 41)  # rank 2 has no counters (yet)
    reading = Reading.take(plan, clock=Clock())
    assert reading.counters == {0: (4, progress.NO_STEP), 1: (9, 41)}
    assert reading.last_step() == 41
    assert Reading(0.0, counters={0: (4, progress.NO_STEP)}).last_step() is None
    assert Reading(0.0).last_step() is None


def test_attempt_events_sample_on_their_own_schedule_and_only_what_moved(
    tmp_path: Path,
) -> None:
    events = EventLog(tmp_path, lambda: 1e9)
    seen: list[dict[str, Any]] = []
    events.listen(seen.append)
    plan = workers(tmp_path, 2)
    attempt = AttemptEvents(events, SimpleNamespace(workers=plan), 1, 1)
    running = ((plan[0], 100), (plan[1], 101))

    def see(at: float, counters: dict[int, tuple[int, int]]) -> None:
        assert not attempt.see(Reading(at, running, counters))

    see(10.0, {0: (1, 1), 1: (1, 1)})
    see(10.0 + PROGRESS_EVERY / 2, {0: (5, 5), 1: (5, 5)})  # not yet due: not sampled
    see(10.0 + PROGRESS_EVERY, {0: (5, 5), 1: (1, 1)})  # rank 1 did not move
    kinds = [(e["kind"], e.get("rank"), e.get("step")) for e in seen]
    assert kinds == [
        ("workers_started", None, None),
        ("progress", 0, 1),
        ("progress", 1, 1),
        ("progress", 0, 5),
    ]


def test_the_status_takes_steps_and_beats_from_the_reading(tmp_path: Path) -> None:
    status = NodeStatus(wall_clock=lambda: 1e9, monotonic=lambda: 20.0)
    status.attempt(SimpleNamespace(workers=workers(tmp_path, 2)))
    status.hear({"kind": "workers_started", "ranks": [0, 1], "pids": [100, 101]})
    status.hear({"kind": "worker_exit", "rank": 1, "failed": True, "returncode": 1})
    status.sample(Reading(10.0, counters={0: (3, 7), 1: (9, 9)}))
    status.sample(Reading(12.0, counters={0: (5, 11), 1: (12, 12)}))
    ranks = {r["rank"]: r for r in status.snapshot()["ranks"]}
    assert (ranks[0]["step"], ranks[0]["beats"], ranks[0]["since_beat"]) == (11, 5, 8.0)
    assert ranks[0]["steps_per_s"] == 2.0
    assert (ranks[1]["step"], ranks[1]["beats"]) == (None, 0)  # failed: no longer read
