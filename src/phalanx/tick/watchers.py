"""The watchers of a round's tick, fed one ``Reading`` each tick.

``Watchers`` is the supervisor's ``on_tick``: on each tick (the supervisor's own: every
monitor interval, at once after a signal or a rendezvous event; no timer or thread of its
own) it reads every rank's counters once and hands that reading to each watcher in turn.
Each watcher decides on its own schedule whether this reading is one it acts on (the hang
watch every check interval, the stragglers every second, the attempt's progress events and
the status file every two seconds). The first that answers True stops the round, and the
ones after it do not see that reading: so a watcher that must see every tick (events,
status) comes before the ones that may stop the round.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from phalanx.plan import WorkerPlan
from phalanx.tick.reading import Reading, Running


class Watcher(Protocol):
    def see(self, reading: Reading) -> bool:
        """This tick's reading; True stops the round."""
        ...


class Watchers:
    def __init__(
        self,
        workers: Sequence[WorkerPlan],
        watchers: Sequence[Watcher],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``workers``: the round's (every one is read, ended ones too)."""
        self._workers = tuple(workers)
        self._watchers = tuple(watchers)
        self._clock = clock

    def __call__(self, running: Running) -> bool:
        """The supervisor's ``on_tick``: True stops the round."""
        reading = Reading.take(self._workers, running, self._clock)
        return any(watcher.see(reading) for watcher in self._watchers)
