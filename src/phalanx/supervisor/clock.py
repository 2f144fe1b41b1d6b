"""The wall clock phalanx stamps on failure records: for people to read, never to order.

Records are ordered by the store's sequence numbers and each host's monotonic clock
(``report.exits.causal_order``), so a host whose clock is off shows a wrong time in the
report but cannot change its root cause. ``PHALANX_WALL_CLOCK_OFFSET`` (seconds, may be
negative) shifts this clock for one agent: how a test puts a host's clock behind
(libfaketime cannot: with the monotonic clock faked, Python's timed lock waits never time
out; with it left alone, libfaketime 0.9.10 makes ``time.sleep`` fail with EINVAL).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from phalanx.errors import UsageError

OFFSET_ENV = "PHALANX_WALL_CLOCK_OFFSET"


@dataclass(frozen=True)
class WallClock:
    offset: float = 0.0  # seconds added to the host's clock

    def now(self) -> float:
        return time.time() + self.offset

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> WallClock:
        """The clock ``environ`` asks for (``OFFSET_ENV``); unset or empty: the host's own."""
        text = environ.get(OFFSET_ENV, "").strip()
        if not text:
            return cls()
        try:
            offset = float(text)
        except ValueError:
            offset = math.nan
        if not math.isfinite(offset):
            raise UsageError(f"{OFFSET_ENV}={text!r}: expected a number of seconds, like -5")
        return cls(offset)
