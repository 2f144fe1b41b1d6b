"""Which ranks caused a hang: pure functions over every rank's progress and main-thread stack.

In a hang most ranks wait inside torch (a collective, a backward pass waiting for its
all-reduce, a CUDA synchronize) for the ranks that never arrive. The suspects are, in order:

1. ranks NOT waiting inside torch while others are (sleeping, looping, stuck in I/O or user
   code);
2. ranks whose progress is behind the others' (a lower ``phalanx.step``, fewer beats);
3. ranks with no stack at all (stuck outside Python or in the kernel) while every rank that
   has one waits;
4. only when 1-3 name nobody: with three ranks or more, those waiting somewhere other than
   where most ranks wait (a mismatched collective).

With no suspect, the report says where everyone waits: the cause is then outside Python (a
dead peer, the network, a device).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from phalanx.hang.stacks import Frame, where
from phalanx.worker.progress import NO_STEP

# Paths whose frames mean "waiting for other ranks" (innermost frames of the main thread).
WAIT_PLACES = (
    "/torch/distributed/",
    "/torch/nn/parallel/",
    "/torch/autograd/",  # DDP's gradient all-reduce is awaited at the end of backward
    "/torch/cuda/",  # synchronize
)
_INNERMOST = 6


@dataclass(frozen=True)
class RankState:
    rank: int
    local_rank: int
    node_rank: int
    host: str
    pid: int
    log_dir: str
    idle: float  # seconds since its progress last moved
    beats: int
    step: int  # NO_STEP when the script never called phalanx.step
    frames: tuple[Frame, ...] | None  # its main thread, innermost first; None: no dump
    # Without a dump, why, when its process state says: "stopped (state T)", "in the kernel
    # (state D, disk sleep)", "a zombie (state Z: exited, not yet reaped)"; "" otherwise.
    state: str = ""

    @property
    def waiting(self) -> bool:
        inner = self.frames[:_INNERMOST] if self.frames else ()
        return any(place in frame.file for frame in inner for place in WAIT_PLACES)

    @property
    def where(self) -> str:
        if self.frames:
            return where(self.frames)
        return self.state or "no Python stack"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        frames = self.frames
        data["frames"] = None if frames is None else [[f.file, f.line, f.func] for f in frames]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankState:
        frames = data.get("frames")
        values = {**data, "frames": None if frames is None else tuple(Frame(*f) for f in frames)}
        return cls(**values)


@dataclass(frozen=True)
class Suspect:
    rank: int
    why: str


Rule = Callable[[Sequence[RankState]], list[Suspect]]


def _not_waiting(ranks: Sequence[RankState]) -> list[Suspect]:
    dumped = [r for r in ranks if r.frames]
    if not any(r.waiting for r in dumped):
        return []
    return [
        Suspect(r.rank, f"not waiting in torch like the others: at {r.where}")
        for r in dumped
        if not r.waiting
    ]


def _behind(ranks: Sequence[RankState]) -> list[Suspect]:
    stepped = [r for r in ranks if r.step != NO_STEP]
    if stepped:
        top = max(r.step for r in stepped)
        return [
            Suspect(r.rank, f"behind: step {r.step}, others reached {top}")
            for r in stepped
            if r.step < top
        ]
    counted = [r for r in ranks if r.beats > 0]
    if len(counted) < len(ranks):
        return []
    top = max((r.beats for r in counted), default=0)
    return [
        Suspect(r.rank, f"behind: {r.beats} progress beats, others reached {top}")
        for r in counted
        if r.beats < top
    ]


def _no_stack(ranks: Sequence[RankState]) -> list[Suspect]:
    dumped = [r for r in ranks if r.frames]
    if not dumped or not all(r.waiting for r in dumped):
        return []
    why = "no Python stack while the others wait (stuck outside Python, or in the kernel)"
    return [
        Suspect(r.rank, f"{r.state} while the others wait" if r.state else why)
        for r in ranks
        if not r.frames
    ]


def _odd_place(ranks: Sequence[RankState]) -> list[Suspect]:
    dumped = [r for r in ranks if r.frames]
    if len(dumped) < 3:
        return []
    places = Counter(r.frames[0] for r in dumped if r.frames)
    (common, count), *_ = places.most_common(1)
    if count * 2 <= len(dumped):
        return []
    return [
        Suspect(r.rank, f"at {r.where}, while {count} ranks wait at {common}")
        for r in dumped
        if r.frames and r.frames[0] != common
    ]


RULES: tuple[Rule, ...] = (_not_waiting, _behind, _no_stack)
FALLBACK_RULES: tuple[Rule, ...] = (_odd_place,)


@dataclass(frozen=True)
class HangAnalysis:
    timeout: float
    ranks: tuple[RankState, ...]
    suspects: tuple[Suspect, ...]  # most likely first
    rule: str = ""  # how ``timeout`` was had, in words ("": --stall-timeout)

    @property
    def culprit(self) -> RankState:
        """The rank the report names as the root cause: the first suspect, or with none the
        rank that has been idle longest."""
        by_rank = {r.rank: r for r in self.ranks}
        if self.suspects:
            return by_rank[self.suspects[0].rank]
        return max(self.ranks, key=lambda r: (r.idle, -r.rank))

    def summary(self) -> list[str]:
        idle = max((r.idle for r in self.ranks), default=0.0)
        rule = self.rule or f"--stall-timeout {self.timeout:g}"
        lines = [f"hang: no progress for {idle:.1f} s ({rule})"]
        if self.suspects:
            lines += [f"suspect: rank {s.rank}: {s.why}" for s in self.suspects]
        else:
            lines.append(
                "no rank stands out (where each rank is, below; if all wait in torch, the "
                "cause may be outside Python: a peer, the network, a device)"
            )
        return lines + [f"  {line}" for line in self.rank_lines()]

    def rank_lines(self) -> list[str]:
        """One line per rank: its progress, and where its main thread is."""
        lines = []
        for r in sorted(self.ranks, key=lambda r: r.rank):
            progress = f"step {r.step}" if r.step != NO_STEP else f"{r.beats} beats"
            state = (
                ("waiting in torch" if r.waiting else "not in torch") if r.frames else "no stack"
            )
            if not r.frames and r.state:
                state = "no stack"  # ``where`` says why: the process state
            idle = f", idle {r.idle:.1f} s" if self.timeout else ""  # no stall watch: unknown
            lines.append(
                f"rank {r.rank} (node {r.node_rank}, pid {r.pid}, {progress}{idle}): "
                f"{state}: {r.where}"
            )
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "timeout": self.timeout,
            "rule": self.rule,
            "suspects": [asdict(s) for s in self.suspects],
            "ranks": [r.to_json() for r in self.ranks],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HangAnalysis:
        return cls(
            float(data["timeout"]),
            tuple(RankState.from_json(r) for r in data["ranks"]),
            tuple(Suspect(**s) for s in data["suspects"]),
            str(data.get("rule") or ""),
        )


def analyse(ranks: Sequence[RankState], timeout: float, rule: str = "") -> HangAnalysis:
    """Name the suspects among ``ranks`` (see the module docstring for the rules)."""
    found: dict[int, list[str]] = {}
    for rules in (RULES, FALLBACK_RULES):
        for check in rules:
            for suspect in check(ranks):
                found.setdefault(suspect.rank, []).append(suspect.why)
        if found:
            break
    idle = {r.rank: r.idle for r in ranks}
    order = sorted(found, key=lambda rank: (-idle[rank], rank))
    suspects = tuple(Suspect(rank, "; ".join(found[rank])) for rank in order)
    return HangAnalysis(timeout, tuple(sorted(ranks, key=lambda r: r.rank)), suspects, rule)


def merge(analyses: Sequence[HangAnalysis]) -> HangAnalysis | None:
    """One job-wide analysis from every node's (each saw only its own ranks)."""
    if not analyses:
        return None
    ranks = {r.rank: r for a in analyses for r in a.ranks}
    # The node whose watch fired has the smallest timeout (0: a node not watching).
    fired = min((a for a in analyses if a.timeout), key=lambda a: a.timeout, default=None)
    if fired is None:
        return analyse(list(ranks.values()), 0.0)
    return analyse(list(ranks.values()), fired.timeout, fired.rule)
