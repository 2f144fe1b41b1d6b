"""One reading of a round's progress counters (``phalanx.worker.progress``): every rank's
beats and step, the live workers, and when it was read.

A tick takes one (``Reading.take``: one ``pread`` per rank, on the memfd the agent holds)
and every watcher decides from that same value; no watcher reads the counters itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from phalanx.plan import WorkerPlan
from phalanx.worker import progress

Running = Sequence[tuple[WorkerPlan, int]]  # (plan, pid) of every live worker


@dataclass(frozen=True)
class Reading:
    at: float  # monotonic time of the reading
    running: tuple[tuple[WorkerPlan, int], ...] = ()
    # Global rank -> (beats, step) of every worker of the round whose counters were there,
    # ended workers too (the agent holds their counters until the next round).
    counters: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    paused: frozenset[int] = frozenset()  # the ranks in a ``phalanx.pause`` now

    @classmethod
    def take(
        cls,
        workers: Iterable[WorkerPlan],
        running: Running = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> Reading:
        at = clock()
        counters, paused = {}, set()
        for worker in workers:
            found = progress.read_counters(str(worker.log_dir / progress.FILE_NAME))
            if found is not None:
                counters[worker.global_rank] = found[:2]
                if found[2] > 0:
                    paused.add(worker.global_rank)
        return cls(at, tuple(running), counters, frozenset(paused))

    def last_step(self) -> int | None:
        """The highest ``phalanx.step(n)`` of these ranks (None: none called it)."""
        steps = [step for _, step in self.counters.values() if step != progress.NO_STEP]
        return max(steps) if steps else None
