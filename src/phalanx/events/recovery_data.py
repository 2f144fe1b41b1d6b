"""The recovery figures as data (``figures`` computes them): per incident, per node, the run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Event = Mapping[str, Any]
STALLED_AFTER = 10.0  # seconds without progress after which a running job counts as stalled
DIGITS = 3  # figures are rounded to the millisecond (events are stamped to the microsecond)


@dataclass(frozen=True)
class Incident:
    """One failure as one node saw it, with its recovery (seconds; None: not known)."""

    node: int | None
    host: str
    round: int | None
    attempt: int | None
    failure_kind: str | None
    rank: int | None
    failed_node: int | None  # the failing rank's node (``node`` is the node that saw it)
    local: bool  # this node's own failure (else a peer's, or a lost node, as it heard)
    failed_at: float  # wall clock, for people (the figures are on the node's monotonic clock)
    detect: float | None
    stop: float | None
    reform: float | None
    back: float | None
    target: str | None  # what "back" means: "step 41", or None (any progress in the new round)
    downtime: float
    recovered: bool
    # c10d: the store's host was lost and the store moved ("node 0 (...) -> node 1 (...) at
    # ADDR:PORT", from the ``store_moved`` event); None: it did not
    store_moved: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class NodeFigures:
    """One node's run as a whole (seconds; ``ettr`` None: its workers reported no progress)."""

    node: int | None
    host: str
    wall: float
    startup: float | None
    downtime: float
    productive: float | None
    ettr: float | None
    stalled: float = 0.0  # the ranks' time without progress at the end (see ``figures``)

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class Recovery:
    incidents: tuple[Incident, ...]
    nodes: tuple[NodeFigures, ...]
    restarts: int = 0  # restarts and re-forms on the node that saw the most

    @property
    def recovering(self) -> bool:
        """Whether there was something to recover from: an incident and a round after it."""
        return bool(self.incidents) and self.restarts > 0

    @property
    def ettr(self) -> float | None:
        """The run's: the lowest of its nodes' (None when no node has one)."""
        known = [n.ettr for n in self.nodes if n.ettr is not None]
        return min(known) if known else None

    def to_json(self) -> dict[str, Any]:
        return {
            "ettr": self.ettr,
            "incidents": [i.to_json() for i in self.incidents],
            "nodes": [n.to_json() for n in self.nodes],
        }
