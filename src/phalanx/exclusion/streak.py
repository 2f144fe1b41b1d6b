"""``--exclude-after K``: a node whose worker was the job's root cause in K failed rounds in a
row leaves the job, its exclusion recorded (``exclusion.file``). ``Streak`` counts them (a
pure fold); the root cause is the job-wide report's (``report.exits.root_cause``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from phalanx.config import LaunchConfig
from phalanx.errors import NodeExcluded
from phalanx.events.log import EventLog
from phalanx.exclusion.file import record, this_node
from phalanx.rendezvous.api import RendezvousResult
from phalanx.report.exits import root_cause
from phalanx.report.job import record_exits


@dataclass(frozen=True)
class Streak:
    """How many failed rounds in a row this node's worker was the job's root cause. A round
    whose root cause was elsewhere (or that did not fail) starts it again."""

    count: int = 0

    def after(self, cause_here: bool) -> Streak:
        return Streak(self.count + 1 if cause_here else 0)


class ExcludeAfter:
    """``--exclude-after K``: this node's root causes in a row, counted after each failed round
    is judged (so every node's record is in); at K the node's exclusion is recorded and, when
    the job would restart, the node leaves (``NodeExcluded``: the others re-form without it)."""

    def __init__(self, config: LaunchConfig, run_dir: Path, events: EventLog) -> None:
        self._config, self._run_dir, self._events = config, run_dir, events
        self._streak = Streak()

    def after_round(
        self,
        failures: Callable[[], list[dict[str, object]]],
        joined: RendezvousResult,
        failed_here: bool,
        *,
        leave: bool,
    ) -> None:
        k = self._config.recovery.exclude_after
        if k <= 0:
            return
        here = failed_here and cause_is_here(failures(), joined.round, joined.node_rank)
        self._streak = self._streak.after(here)
        if self._streak.count < k:
            return
        node = this_node(self._config.rendezvous.local_addr)
        reason = f"its worker was the job's root cause in {k} failed rounds in a row"
        record(self._config.recovery.exclude_file, self._run_dir, node, reason)
        self._events.emit("excluded", name=str(node), reason=reason)
        if leave:
            raise NodeExcluded(f"this node ({node}) is excluded: {reason}; leaving the job")


def cause_is_here(records: list[dict[str, object]], round_: int, node_rank: int) -> bool:
    """Whether the job-wide root cause of round ``round_`` (``report.exits.root_cause`` of
    every node's failure records, in the store's order) is a worker of node ``node_rank``."""
    # The records come oldest first, in the store's order: that is their sequence number.
    # ``record_exits`` reads them as the report does: a node found lost in the round (its
    # ``node_lost`` record) is the cause ahead of this node's ranks that failed only
    # because it went (``peer_error``), so a survivor's streak does not grow for it.
    ordered = [
        {**r, "seq": r.get("seq") or index}
        for index, r in enumerate(records, 1)
        if r.get("round") == round_
    ]
    cause = root_cause(record_exits(ordered))
    return cause is not None and cause.node_rank == node_rank
