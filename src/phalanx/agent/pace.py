"""How often a round's tick comes and progress is read: pure functions of the config.

One node (nothing to poll in the rendezvous) ticks once a second, which is also how often
the stall timeout and the hang watch read progress at their defaults: an idle agent wakes
about once a second whether the hang watch is on or off."""

from __future__ import annotations

from phalanx.config import LaunchConfig
from phalanx.config.workers import LaunchMode
from phalanx.hang.settings import HangWatch

QUIET_TICK = 1.0  # seconds between ticks with nothing to poll and nothing read more often


def hang_watch(config: LaunchConfig) -> HangWatch | None:
    """The hang watch, where phalanx sees the ranks' progress (not a --spawn-owner's
    children, nor --no-python programs, which have no counters)."""
    workers = config.workers
    if workers.spawn_owner or workers.mode is LaunchMode.NO_PYTHON:
        return None
    return config.checks.hang_watch


def check_every(config: LaunchConfig) -> float:
    """How often progress is read: often enough to notice a stall within a tenth of the
    stall timeout or of the hang watch's floor (at most once a second), never more often
    than the monitor interval."""
    watch = hang_watch(config)
    timeout = config.checks.stall_timeout or (watch.floor if watch else 0.0)
    return max(config.workers.monitor_interval, min(1.0, timeout / 10))


def tick_every(config: LaunchConfig, quiet: bool) -> float | None:
    """The supervisor's tick when the rendezvous has nothing to poll (``quiet``: one node):
    as often as progress is read (``check_every``), else once a second (the status file,
    request files and progress samples need no more); None: every monitor interval, for
    the peers' events."""
    if not quiet:
        return None
    if config.checks.stall_timeout or hang_watch(config):
        return check_every(config)
    return max(config.workers.monitor_interval, QUIET_TICK)
