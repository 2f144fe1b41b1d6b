"""The node check's settings: what it does with a node it names, and when it names one.

A node is named when one of its figures is far from the median of the round's nodes:
``compute`` (a fixed matmul's speed) or ``throughput`` (its best link's) under the median
divided by that factor; ``latency`` (its best link's round trip) over the median times that
factor and at least ``latency_ms`` milliseconds over it (so microseconds of noise on a quiet
network name nobody). ``min_free_mb``: the least free space a run or checkpoint directory
may have.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import Enum
from pathlib import Path

MODES = ("off", "warn", "exclude")


class Action(Enum):
    OFF = "off"  # no check
    WARN = "warn"  # name the node, start anyway
    EXCLUDE = "exclude"  # a named node leaves the job (exit EXCLUDED_EXIT_CODE)


@dataclass(frozen=True)
class Thresholds:
    compute: float = 3.0
    throughput: float = 10.0
    latency: float = 10.0
    latency_ms: float = 20.0
    min_free_mb: float = 100.0

    @staticmethod
    def parse(text: str) -> Thresholds:
        """``key=value[,key=value...]`` over the defaults; raises ``ValueError`` naming the
        problem (an unknown key, a value that is not a positive number)."""
        known = {f.name for f in fields(Thresholds)}
        values: dict[str, float] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or key not in known:
                raise ValueError(
                    f"--node-check-thresholds: {item!r}: expected key=value with a key of "
                    f"{', '.join(sorted(known))}"
                )
            try:
                number = float(value)
            except ValueError:
                number = -1.0
            if not number > 0 or number == float("inf"):
                raise ValueError(
                    f"--node-check-thresholds: {key}={value!r}: expected a positive number"
                )
            values[key] = number
        factors = ("compute", "throughput", "latency")
        for key in factors:
            if values.get(key, 2.0) <= 1:
                raise ValueError(
                    f"--node-check-thresholds: {key}={values[key]:g}: a factor over the "
                    "median must be above 1"
                )
        return replace(Thresholds(), **values)


@dataclass(frozen=True)
class CheckSettings:
    action: Action = Action.WARN
    thresholds: Thresholds = Thresholds()
    checkpoint_dir: Path | None = None  # also checked: writable, not full
