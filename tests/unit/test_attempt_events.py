"""The attempt's progress events (``agent.attempt_events``) from hand-made readings: said at
once when a rank first moves and when it gets back to the failed attempt's step, else every
2 s; each with the ``age`` of the reading before it. (The real job: test_recovery_words.py.)"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from phalanx.agent.attempt_events import AttemptEvents
from phalanx.events.log import EventLog
from phalanx.tick import Reading


def test_first_moves_and_the_way_back_are_said_at_once_with_their_age(tmp_path: Path) -> None:
    events = EventLog(tmp_path, lambda: 1e9)
    seen: list[dict[str, Any]] = []
    events.listen(seen.append)
    plan = [SimpleNamespace(global_rank=r, log_dir=tmp_path / str(r)) for r in (0, 1)]
    attempt = AttemptEvents(events, SimpleNamespace(workers=plan), 1, 2, redo=5)
    running = ((plan[0], 100), (plan[1], 101))

    def see(at: float, counters: dict[int, tuple[int, int]]) -> None:
        assert not attempt.see(Reading(at, running, counters))

    see(10.0, {0: (0, -1), 1: (0, -1)})  # due, but nothing moved
    see(10.5, {0: (1, 0), 1: (0, -1)})  # rank 0's first move: at once
    see(10.7, {0: (3, 2), 1: (1, 0)})  # rank 1's first move; rank 0 waits for the sample
    see(11.5, {0: (6, 5), 1: (2, 1)})  # rank 0 back at step 5: at once
    see(11.6, {0: (7, 6), 1: (2, 1)})  # neither: not due
    see(12.0, {0: (7, 6), 1: (6, 5)})  # due: both (rank 0 moved after 11.5, rank 1 after 11.6)
    said = [(e["rank"], e["step"], e["age"]) for e in seen if e["kind"] == "progress"]
    assert said == [(0, 0, 0.5), (1, 0, 0.2), (0, 5, 0.8), (0, 6, 0.5), (1, 5, 0.4)]
    assert attempt.peak == 6  # where the next attempt is back
