"""Stall detection: per rank, when did its progress last move?

Progress is the rank's beat counter (``phalanx.worker.progress``: optimizer steps,
``phalanx.step``, ``phalanx.heartbeat``). Until a rank's first beat -- imports, data loading,
the first forward pass, or a script with no optimizer at all -- the CPU time of its main
thread stands in: a main thread that sleeps or waits in a collective uses none, one that
computes does. Once a rank beats, only its beats count, so a rank spinning in a busy wait
(an NCCL wait can) still stalls. A rank is stalled when its progress has not moved for
``timeout`` seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from phalanx.worker.progress import NO_STEP


def main_thread_cpu(pid: int, proc: str = "/proc") -> int | None:
    """Clock ticks the main thread of ``pid`` has run (user + system), or None if gone."""
    try:
        with open(f"{proc}/{pid}/task/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # after the command name, which may hold spaces
    try:
        return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    except (IndexError, ValueError):
        return None


@dataclass
class _Track:
    changed_at: float
    beats: int = 0
    step: int = NO_STEP
    cpu: int | None = None


class StallDetector:
    """Feed it readings with ``observe``; ask ``stalled`` which ranks stopped moving."""

    def __init__(self, timeout: float, clock: Callable[[], float]) -> None:
        self.timeout = timeout
        self._clock = clock
        self._tracks: dict[int, _Track] = {}

    def observe(self, rank: int, progress: tuple[int, int] | None, cpu: int | None) -> None:
        """One reading: ``progress`` is ``(beats, step)`` (None: no counter file yet)."""
        now = self._clock()
        track = self._tracks.setdefault(rank, _Track(changed_at=now, cpu=cpu))
        beats, step = progress if progress is not None else (0, NO_STEP)
        if beats != track.beats:
            track.changed_at = now
        elif beats == 0 and cpu is not None and cpu != track.cpu:
            track.changed_at = now  # no beat yet: CPU time of the main thread stands in
        track.beats, track.step, track.cpu = beats, step, cpu

    def idle(self, rank: int) -> float:
        """Seconds since ``rank``'s progress last moved (0 for a rank never observed)."""
        track = self._tracks.get(rank)
        return 0.0 if track is None else self._clock() - track.changed_at

    def stalled(self) -> list[int]:
        return sorted(rank for rank in self._tracks if self.idle(rank) >= self.timeout)

    def progress(self, rank: int) -> tuple[int, int]:
        track = self._tracks.get(rank)
        return (0, NO_STEP) if track is None else (track.beats, track.step)
