"""The agent's side of ``phalanx status``: this node's status kept current, written to
``<run dir>/status.json`` when it changed (looked at every ``WRITE_EVERY`` seconds; at once
when a worker starts or ends, a failure or restart happens, or the job ends), and requests
answered. What only the clock moves (``updated_at``, a rank's ``since_beat``) is no change:
an idle job's file is not rewritten, and says as of when it is true.

Everything runs on the round's tick (``see``, a watcher of ``phalanx.tick``: the ranks'
progress comes from that tick's reading), and nothing there waits: the file is written by a
thread of its own (``LatestWriter``), request files are found with one ``scandir`` a
second, and the other nodes are asked and answered by helper threads (``exchange``). The
events answered to other nodes are kept in memory, bounded (``EventTail``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.events.log import EventLog
from phalanx.plan import RoundPlan
from phalanx.rendezvous.api import RendezvousResult, StatusExchange
from phalanx.status.exchange import ANSWER_LIMIT, StatusRequests, cap_events, encode_answer
from phalanx.status.files import STATUS_FILE
from phalanx.status.node import NodeStatus
from phalanx.status.writer import LatestWriter
from phalanx.tick import Reading

WRITE_EVERY = 2.0
SCAN_EVERY = 1.0
# Kinds after which the file is written at once (a person watching sees them without delay).
_WRITE_NOW = frozenset(
    {"rdzv_start", "rdzv_done", "workers_started", "worker_exit", "failure", "restart", "job_end",
     "hang", "hang_over"}
)  # fmt: skip


class EventTail:
    """This node's events as ``events.jsonl`` lines, in memory, at most about twice
    ``ANSWER_LIMIT`` (compacted with ``cap_events``; the dropped are counted)."""

    def __init__(self, limit: int = ANSWER_LIMIT) -> None:
        self._limit = limit
        self._lines: list[bytes] = []
        self._bytes = 0
        self.dropped = 0

    def add(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, default=str) + "\n").encode()
        self._lines.append(line)
        self._bytes += len(line)
        if self._bytes > 2 * self._limit:
            self._lines, cut = cap_events(self._lines, self._limit)
            self._bytes = sum(len(line) for line in self._lines)
            self.dropped += cut

    @property
    def lines(self) -> list[bytes]:
        return list(self._lines)


class StatusService:
    def __init__(
        self, run_dir: Path, events: EventLog, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.node = NodeStatus(events.now, monotonic)
        self._mono = monotonic
        self._writer = LatestWriter(run_dir / STATUS_FILE)
        self._tail = EventTail()
        self._requests = StatusRequests(run_dir, self._answer, self.node.snapshot)
        self._next_write = 0.0
        self._next_scan = 0.0
        self._written: dict[str, Any] | None = None  # the last content offered, clock aside
        self._exchange: StatusExchange | None = None
        self._reading: Reading | None = None  # the last tick's
        events.listen(self._hear)

    def begin(
        self, plan: RoundPlan, joined: RendezvousResult, exchange: StatusExchange | None
    ) -> None:
        """An attempt of round ``joined`` is about to start with ``plan``."""
        self.node.attempt(plan)
        self._requests.round(joined, exchange)
        self._exchange = exchange

    def see(self, reading: Reading) -> bool:
        """This service's share of the tick (``phalanx.tick``); never stops the round."""
        self._reading = reading
        now = self._mono()
        if now >= self._next_write:
            self.node.sample(reading)
            self._spares()
            self._write(changed_only=True)
        if now >= self._next_scan:
            self._next_scan = now + SCAN_EVERY
            self._requests.check_files()
        self._requests.check_peers()
        return False

    def close(self) -> None:
        """The final status (the job's end), written within the report's bound."""
        self._write()
        self._requests.close()
        self._writer.close()

    def _hear(self, record: dict[str, Any]) -> None:
        self.node.hear(record)
        self._tail.add(record)
        if record.get("kind") in _WRITE_NOW:
            self._write()

    def _write(self, changed_only: bool = False) -> None:
        self._next_write = self._mono() + WRITE_EVERY
        snapshot = self.node.snapshot()
        content = _without_clock(snapshot)
        if changed_only and content == self._written:
            return
        self._written = content
        self._writer.offer(json.dumps(snapshot, indent=1).encode() + b"\n")

    def _spares(self) -> None:
        """The spares the heartbeat thread last counted (no network here)."""
        if self._exchange is not None:
            self.node.spares(self._exchange.spares())

    def _answer(self) -> bytes:
        if self._reading is not None:  # asked on a tick: that tick's reading
            self.node.sample(self._reading)
        self._spares()
        return encode_answer(self.node.snapshot(), self._tail.lines, self._tail.dropped)


def _without_clock(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The snapshot less what only the passing of time changes."""
    ranks = [{k: v for k, v in r.items() if k != "since_beat"} for r in snapshot["ranks"]]
    return {**{k: v for k, v in snapshot.items() if k != "updated_at"}, "ranks": ranks}
