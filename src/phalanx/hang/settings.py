"""The hang watch's settings (``--hang-watch``): plain data the config holds; the watch is
``phalanx.hang.rhythm`` (the bounds) and ``phalanx.hang.watch`` (what is done at them).

``--hang-watch on`` (the default), ``off``, or ``key=value[,...]`` of ``floor``, ``factor``
and ``grace`` (the others keep their defaults). The values come from the hang corpus
(``benchmarks/hang_corpus.py``, its table on docs/how-to/hangs.md): its longest healthy
silence was a 40 s first step (under the grace) and a 15 s evaluation (under the floor).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

DEFAULT_FLOOR = 60.0  # no rank is named before a minute of silence, whatever its rhythm
DEFAULT_FACTOR = 5.0  # how far past its usual longest gap a rank's silence must go
DEFAULT_GRACE = 300.0  # the bound before a rank has a rhythm, and while it is paused
FAIL_FACTOR = 10.0  # the round fails at this many times the bound a rank was named at
EXAMPLE = "on, off, or floor=60,factor=5,grace=300"


@dataclass(frozen=True)
class HangWatch:
    """``--hang-watch``: named past ``max(floor, factor x p99 of its gaps)``, or ``grace``
    before its rhythm and while paused; the round fails at ``FAIL_FACTOR`` x that bound."""

    floor: float = DEFAULT_FLOOR
    factor: float = DEFAULT_FACTOR
    grace: float = DEFAULT_GRACE

    def describe(self) -> str:
        return f"floor={self.floor:g},factor={self.factor:g},grace={self.grace:g}"


def parse_hang_watch(text: str, what: str = "--hang-watch") -> HangWatch | None:
    """``--hang-watch``'s value: the settings, or None for ``off``. Raises ``ValueError``
    with the message to show (what was given, what is expected)."""
    spec = text.strip().lower()
    if spec in ("on", ""):
        return HangWatch()
    if spec == "off":
        return None
    known = {f.name for f in fields(HangWatch)}
    values: dict[str, float] = {}
    for item in spec.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or key not in known:
            raise ValueError(f"{what}: expected {EXAMPLE}, got {text!r}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{what}: {key} must be a number, got {value!r}") from None
        if not 0 < number < float("inf") or (key == "factor" and number < 1):
            least = "1 or more" if key == "factor" else "above 0"
            raise ValueError(f"{what}: {key} must be {least}, got {value}")
        values[key] = number
    return HangWatch(**values)
