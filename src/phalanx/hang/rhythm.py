"""Hang bounds from each rank's own rhythm (``--hang-watch``, on by default).

Per rank, from the tick's readings of its progress counters (``phalanx.worker.progress``):

- its *gaps*: the time between two readings where its beats moved, from its first beat on
  (the time before it -- imports, compile, data loading -- is no gap); the last ``WINDOW`` are
  kept, less any gap that held a pause. The first steps' gaps count: a job whose every step
  is slow shows it from its second step, and a slow second step only raises the bound;
- its *bound*: before its ``STARTUP_BEATS``-th beat (its start-up), and while it is paused
  (``phalanx.pause``, ``phalanx.checkpoint.save``), the grace; else
  ``max(floor, factor x the 99th percentile of its gaps)`` (with fewer than 100 gaps, the
  longest). A straggler's gaps are long, and so is its bound: slow is not hung.

Until a rank's first beat the CPU time of its main thread stands in for progress, as in
``phalanx.hang.stall``. Gaps are seen at the tick's resolution (about a second): a rank that
steps faster shows gaps of one tick, and the floor decides. What is done at the bound (name
the rank; fail the round at ``FAIL_FACTOR`` times it) is ``phalanx.hang.watch``'s.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from phalanx.hang.settings import HangWatch
from phalanx.worker.progress import NO_STEP

STARTUP_BEATS = 3
WINDOW = 1000  # gaps kept per rank: at one a second, the last quarter of an hour or more
QUANTILE = 0.99


class Bound(NamedTuple):
    seconds: float
    acts: bool  # the rank has a rhythm and is not paused: the round may fail past it
    rule: str  # how it was had, in words


@dataclass
class _Rank:
    moved_at: float
    beats: int = 0
    step: int = NO_STEP
    cpu: int | None = None
    paused: bool = False
    held: bool = False  # the gap under way held a pause: not part of the rhythm
    gaps: deque[float] = field(default_factory=deque)
    ordered: list[float] = field(default_factory=list)  # the same gaps, sorted

    def add(self, gap: float) -> None:
        if len(self.gaps) == WINDOW:
            oldest = self.gaps.popleft()
            del self.ordered[bisect.bisect_left(self.ordered, oldest)]
        self.gaps.append(gap)
        bisect.insort(self.ordered, gap)

    def quantile(self) -> float:
        return self.ordered[max(0, math.ceil(QUANTILE * len(self.ordered)) - 1)]


class RhythmDetector:
    """Feed it readings with ``observe``; ask ``bound`` and ``idle`` of each rank."""

    def __init__(self, settings: HangWatch, clock: Callable[[], float]) -> None:
        self.settings = settings
        self._clock = clock
        self._ranks: dict[int, _Rank] = {}

    def wants_cpu(self, rank: int) -> bool:
        """Whether ``observe`` needs the main thread's CPU time (before the first beat)."""
        track = self._ranks.get(rank)
        return track is None or track.beats == 0

    def observe(
        self, rank: int, counters: tuple[int, int] | None, paused: bool, cpu: int | None
    ) -> float | None:
        """One reading; returns the silence it ended (seconds), None when nothing moved."""
        now = self._clock()
        track = self._ranks.setdefault(rank, _Rank(moved_at=now, cpu=cpu))
        beats, step = counters if counters is not None else (0, NO_STEP)
        ended = None
        if beats != track.beats:
            ended = now - track.moved_at
            if track.beats > 0 and not track.held:
                track.add(ended)
            track.moved_at, track.held = now, False
        elif beats == 0 and cpu is not None and cpu != track.cpu:
            ended = now - track.moved_at  # no beat yet: CPU time of the main thread stands in
            track.moved_at = now
        track.beats, track.step, track.cpu, track.paused = beats, step, cpu, paused
        track.held = track.held or paused
        return ended

    def idle(self, rank: int) -> float:
        """Seconds since ``rank``'s progress last moved (0 for a rank never observed)."""
        track = self._ranks.get(rank)
        return 0.0 if track is None else self._clock() - track.moved_at

    def moved_at(self, rank: int) -> float | None:
        """When ``rank``'s progress last moved (the clock's time; None: never observed)."""
        track = self._ranks.get(rank)
        return None if track is None else track.moved_at

    def progress(self, rank: int) -> tuple[int, int]:
        track = self._ranks.get(rank)
        return (0, NO_STEP) if track is None else (track.beats, track.step)

    def bound(self, rank: int) -> Bound:
        """How long ``rank`` may stay silent now before it is named."""
        s, track = self.settings, self._ranks.get(rank)
        if track is None or track.beats < STARTUP_BEATS:
            return Bound(s.grace, False, f"start-up grace {s.grace:g} s")
        if track.paused:
            return Bound(s.grace, False, f"paused, grace {s.grace:g} s")
        if not track.gaps:
            return Bound(s.floor, True, f"floor {s.floor:g} s")
        gap = track.quantile()
        seconds = max(s.floor, s.factor * gap)
        rule = f"max(floor {s.floor:g} s, {s.factor:g} x its p99 gap {gap:.2f} s)"
        return Bound(seconds, True, rule)
