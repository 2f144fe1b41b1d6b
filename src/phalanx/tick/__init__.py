"""The round's tick: one reading of every rank's progress counters, fed to the watchers."""

from __future__ import annotations

from phalanx.tick.reading import Reading, Running
from phalanx.tick.watchers import Watcher, Watchers

__all__ = ["Reading", "Running", "Watcher", "Watchers"]
