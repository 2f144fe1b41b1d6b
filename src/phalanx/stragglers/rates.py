"""Stragglers: a rank (or node) whose step rate stays below its peers' over a window.

Pure bookkeeping on the progress counters the agent already samples (``worker.progress``):
``RateWindow.observe(now, {name: beats})`` gives each name's rate over a whole window, and
``judge`` names who is a straggler among rates that may come from several nodes (each node
measures its own ranks on its own clock; only rates travel). ``stragglers.watch`` wires it.

Why a window and a fraction of the *median of the others*: one slow step (a checkpoint, a
data-loader hiccup) must not name anyone, and comparing with the others' median (not the
mean, not the fastest) keeps one fast outlier from making every healthy rank look slow.
A name whose counters have not advanced at all on every peer (a pause for evaluation, a
rendezvous) is no straggler: with a peer median of zero nobody is named.

What step rates cannot see: ranks that wait for each other every step (DDP's all-reduce)
all move at the slowest one's pace, so their rates are equal whoever is slow. Stragglers
are named where ranks advance on their own between synchronizations.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from phalanx.stragglers.settings import DEFAULT_FRACTION, DEFAULT_WINDOW_S

# A rank whose counter has not moved for this long (or a tenth of the window, if longer) is
# waiting, not slow: a rank done with its share at a barrier, an evaluation pause; a slow
# rank still moves. Neither judged nor counted in the others' median.
MIN_IDLE_S = 2.0


@dataclass
class RateWindow:
    """Each name's rate (beats per second) over the last ``window_s`` seconds, once its
    samples since its first beat span the whole window."""

    window_s: float = DEFAULT_WINDOW_S
    _samples: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)

    def observe(self, now: float, beats: Mapping[str, int]) -> dict[str, float]:
        for name, count in beats.items():
            if count == 0:
                # Not stepping yet (imports, the process group, data loading): judged from
                # its first step on; a rank that never steps is the stall timeout's business.
                self._samples.pop(name, None)
                continue
            samples = self._samples.setdefault(name, deque())
            if samples and count < samples[-1][1]:
                samples.clear()  # a new counter (a restarted worker): start again
            samples.append((now, count))
            # keep one sample at or before the window's start, so the span covers it whole
            while len(samples) > 1 and samples[1][0] <= now - self.window_s:
                samples.popleft()
        for gone in set(self._samples) - set(beats):
            del self._samples[gone]  # a rank that left (a new round) is judged afresh
        rates: dict[str, float] = {}
        for name, samples in self._samples.items():
            start, first = samples[0]
            if now - start < self.window_s:
                continue  # not watched for a whole window yet
            end, last = samples[-1]
            if now - _reached(samples) >= max(MIN_IDLE_S, self.window_s / 10):
                continue  # not moving at all: waiting (a barrier, a pause) or hung, not slow
            rates[name] = (last - first) / (end - start) if end > start else 0.0
        return rates


def _reached(samples: deque[tuple[float, int]]) -> float:
    """When the counter first showed its last value (as sampled)."""
    last, when = samples[-1][1], samples[-1][0]
    for t, count in reversed(samples):
        if count != last:
            break
        when = t
    return when


def judge(rates: Mapping[str, float], fraction: float) -> dict[str, tuple[float, float]]:
    """``{name: (its rate, the others' median rate)}`` for each name below ``fraction`` of
    the others' median."""
    import statistics  # only where ranks are compared: not at every launch (fractions, decimal)

    named: dict[str, tuple[float, float]] = {}
    for name, rate in rates.items():
        peers = [other for key, other in rates.items() if key != name]
        if not peers:
            continue
        median = statistics.median(peers)
        if median > 0 and rate < fraction * median:
            named[name] = (rate, median)
    return named


@dataclass
class StragglerDetector:
    """Both steps on one clock: ``observe`` returns the stragglers now."""

    fraction: float = DEFAULT_FRACTION
    window_s: float = DEFAULT_WINDOW_S
    _window: RateWindow | None = None

    def observe(self, now: float, beats: dict[str, int]) -> dict[str, tuple[float, float]]:
        if self._window is None:
            self._window = RateWindow(self.window_s)
        return judge(self._window.observe(now, beats), self.fraction)
