"""Stragglers: a rank (or node) whose step rate stays below its peers' over a window.

Pure bookkeeping on the progress counters the agent already samples (``worker.progress``):
the caller feeds ``observe(now, {name: beats})`` at its own cadence and gets back who is a
straggler now. Not yet wired into the agent, status, metrics or timeline (issue 28, item 2).

Why a window and a fraction of the *median of the others*: one slow step (a checkpoint, a
data-loader hiccup) must not name anyone, and comparing with the others' median (not the
mean, not the fastest) keeps one fast outlier from making every healthy rank look slow.
A name whose counters have not advanced at all on every peer (a pause for evaluation, a
rendezvous) is no straggler: with a peer median of zero nobody is named.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

DEFAULT_FRACTION = 0.5  # below half the peers' rate: far past run-to-run noise on a shared host
DEFAULT_WINDOW_S = 30.0  # long enough that one slow step (a checkpoint) names nobody


@dataclass
class StragglerDetector:
    fraction: float = DEFAULT_FRACTION
    window_s: float = DEFAULT_WINDOW_S
    _samples: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)

    def observe(self, now: float, beats: dict[str, int]) -> dict[str, tuple[float, float]]:
        """Record one sample per name; return ``{name: (its rate, peers' median rate)}``
        for each straggler, judged only once a name's samples span the whole window."""
        for name, count in beats.items():
            samples = self._samples.setdefault(name, deque())
            samples.append((now, count))
            # keep one sample at or before the window's start, so the span covers it whole
            while len(samples) > 1 and samples[1][0] <= now - self.window_s:
                samples.popleft()
        for gone in set(self._samples) - set(beats):
            del self._samples[gone]  # a rank that left (a new round) is judged afresh
        rates = self._rates(now)
        named: dict[str, tuple[float, float]] = {}
        for name, rate in rates.items():
            peers = [other for key, other in rates.items() if key != name]
            if not peers:
                continue
            median = statistics.median(peers)
            if median > 0 and rate < self.fraction * median:
                named[name] = (rate, median)
        return named

    def _rates(self, now: float) -> dict[str, float]:
        rates: dict[str, float] = {}
        for name, samples in self._samples.items():
            start, first = samples[0]
            if now - start < self.window_s:
                continue  # not watched for a whole window yet
            end, last = samples[-1]
            rates[name] = (last - first) / (end - start) if end > start else 0.0
        return rates
