"""The straggler watch's settings (``--straggler-action``, ``--straggler-fraction``,
``--straggler-window``): plain data the config holds; the watch is ``phalanx.stragglers.rates``
and ``phalanx.stragglers.watch``."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

DEFAULT_FRACTION = 0.5  # below half the peers' rate: far past run-to-run noise on a shared host
DEFAULT_WINDOW_S = 60.0  # long enough that one slow step (a checkpoint) names nobody


class StragglerAction(Enum):
    OFF = "off"  # not watched
    WARN = "warn"  # named (log, events, status, metrics, timeline); the job goes on
    EXCLUDE = "exclude"  # named, and its node leaves the job (exit 69); the rest re-form


@dataclass(frozen=True)
class StragglerSettings:
    """``--straggler-action``, ``--straggler-fraction``, ``--straggler-window``."""

    action: StragglerAction = StragglerAction.WARN
    fraction: float = DEFAULT_FRACTION
    window_s: float = DEFAULT_WINDOW_S


def problems(fraction: float, window_s: float) -> list[str]:
    """What is wrong with a fraction and a window, one message each (none: fine)."""
    found = []
    if not 0 < fraction < 1:
        found.append(
            f"--straggler-fraction: expected a number between 0 and 1 (exclusive), got "
            f"{fraction:g}; e.g. 0.5 names a rank below half its peers' median step rate"
        )
    if window_s <= 0:
        found.append(f"--straggler-window: expected seconds above 0, got {window_s:g}; e.g. 60")
    return found
