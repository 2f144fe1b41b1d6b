"""One node's live status: what ``phalanx status`` shows of it, built from what the agent
already has.

``NodeStatus.hear`` is an ``EventLog`` listener: rounds, restarts, worker starts and exits,
failures and the job's end come from the events. Steps and beats come from the ranks'
progress counters (``phalanx.worker.progress``), as the tick read them (``sample``):
steps/s is taken over the last ``WINDOW`` samples, and "since the last beat" from the
last sample where the beat counter moved. ``snapshot`` is the JSON-able status.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from phalanx.plan import RoundPlan
from phalanx.tick import Reading
from phalanx.worker import progress

STATUS_VERSION = 1
WINDOW = 5  # progress samples steps/s is taken over (about 10 s at one sample per 2 s)

# The fields of the failure event kept as the node's last failure.
_FAILURE_FIELDS = (
    "round", "attempt", "rank", "failed_node", "failure_kind", "reason", "exit_code", "local",
    "failed_at", "t",
)  # fmt: skip


@dataclass
class _Rank:
    rank: int
    local_rank: int | None
    pid: int | None
    state: str = "running"  # running, exited (0, or stopped by phalanx), failed
    returncode: int | None = None
    signal: str | None = None
    step: int | None = None
    beats: int = 0
    moved_at: float | None = None  # monotonic time of the last sample where beats moved
    hung: bool = False  # named by the hang watch, and not moved since (a "hang" event)
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def steps_per_s(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
        return round((s1 - s0) / (t1 - t0), 3) if t1 > t0 else None

    def saw(self, now: float, beats: int, step: int | None) -> None:
        """A reading of the rank's counters at ``now`` (monotonic)."""
        if beats != self.beats:
            self.moved_at = now
        self.beats = beats
        if step is not None and step != progress.NO_STEP:
            self.step = step
            if not self.samples or self.samples[-1][0] < now:
                self.samples.append((now, step))

    def to_json(self, now: float) -> dict[str, Any]:
        since = None  # only a running rank's silence means anything
        if self.moved_at is not None and self.state == "running":
            since = round(max(0.0, now - self.moved_at), 1)
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "pid": self.pid,
            "state": self.state,
            "returncode": self.returncode,
            "signal": self.signal,
            "step": self.step,
            "beats": self.beats,
            "steps_per_s": self.steps_per_s(),
            "since_beat": since,
            "hung": self.hung,
        }


STRAGGLERS_KEPT = 5  # the newest straggler lines in the status


class NodeStatus:
    """Called from the agent's thread only (listeners run in the emitting thread)."""

    def __init__(
        self,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wall = wall_clock
        self._mono = monotonic
        self._info: dict[str, Any] = {
            "run_id": None, "pid": None, "host": None, "node": None, "state": "starting",
            "round": None, "attempt": 0, "restarts": 0, "max_restarts": None,
            "num_nodes": None, "world_size": None, "members": [], "started_at": None,
            "last_failure": None, "outcome": None, "exit_code": None, "ended_at": None,
            "spares": None,
        }  # fmt: skip
        self._ranks: dict[int, _Rank] = {}
        self._local_ranks: dict[int, int] = {}

    @property
    def node(self) -> int | None:
        node = self._info["node"]
        return node if isinstance(node, int) else None

    @property
    def ended(self) -> bool:
        return self._info["outcome"] is not None

    def attempt(self, plan: RoundPlan) -> None:
        """The attempt about to start: its ranks' local ranks."""
        self._local_ranks = {w.global_rank: w.local_rank for w in plan.workers}

    def spares(self, count: int | None) -> None:
        """How many agents wait for the next round (None: not known here, e.g. a local
        rendezvous)."""
        self._info["spares"] = count

    def hear(self, record: dict[str, Any]) -> None:
        handler = _HANDLERS.get(str(record.get("kind")))
        info = self._info
        info["host"] = record.get("host", info["host"])
        if record.get("node") is not None:
            info["node"] = record["node"]
        if handler is not None:
            handler(self, record)

    def sample(self, reading: Reading) -> None:
        """The running ranks' progress counters, as a tick read them."""
        for rank in self._ranks.values():
            counters = reading.counters.get(rank.rank)
            if rank.state != "running" or counters is None:
                continue
            rank.saw(reading.at, *counters)

    def snapshot(self) -> dict[str, Any]:
        now = self._mono()
        return {
            "v": STATUS_VERSION,
            **self._info,
            "updated_at": round(self._wall(), 3),
            "ranks": [r.to_json(now) for _, r in sorted(self._ranks.items())],
        }

    # -- events ----------------------------------------------------------------------------
    def _run_start(self, e: dict[str, Any]) -> None:
        self._info.update(
            run_id=e.get("run_id"),
            pid=e.get("pid"),
            max_restarts=e.get("max_restarts"),
            started_at=e.get("t"),
        )

    def _rdzv_start(self, e: dict[str, Any]) -> None:
        self._info["state"] = "rendezvous"

    def _rdzv_done(self, e: dict[str, Any]) -> None:
        self._info.update(
            round=e.get("round"),
            attempt=e.get("attempt"),
            restarts=e.get("restart_count") or 0,
            num_nodes=e.get("num_nodes"),
            world_size=e.get("world_size"),
            members=e.get("members") or [],
            state="starting",
        )

    def _node_check(self, e: dict[str, Any]) -> None:
        named = e.get("named") or []
        self._info["node_check"] = [n.get("line") for n in named if isinstance(n, dict)]

    def _straggler(self, e: dict[str, Any]) -> None:
        line = (
            f"straggler (round {e.get('round')}): rank {e.get('rank')} on node "
            f"{e.get('straggler_node')} ({e.get('straggler_host')}), {e.get('rate')} steps/s, "
            f"the others' median {e.get('median')} (--straggler-action {e.get('action')})"
        )
        self._info["stragglers"] = [*self._info.get("stragglers", ()), line][-STRAGGLERS_KEPT:]

    def _workers_started(self, e: dict[str, Any]) -> None:
        self._info["state"] = "running"
        ranks, pids = e.get("ranks") or [], e.get("pids") or []
        self._ranks = {
            rank: _Rank(rank, self._local_ranks.get(rank), pid)
            for rank, pid in zip(ranks, pids, strict=False)
        }

    def _progress(self, e: dict[str, Any]) -> None:
        # The attempt's last sample (``AttemptEvents.ended``) comes after the rank's
        # exit was seen, before its ``worker_exit``: the exact last step.
        rank = self._ranks.get(e.get("rank", -1))
        beats, step = e.get("beats"), e.get("step")
        if rank is not None and isinstance(beats, int) and isinstance(e.get("mono"), float):
            rank.saw(e["mono"], beats, step if isinstance(step, int) else None)

    def _hang(self, e: dict[str, Any]) -> None:
        for rank in e.get("ranks") or []:
            if rank in self._ranks:
                self._ranks[rank].hung = True

    def _hang_over(self, e: dict[str, Any]) -> None:
        rank = self._ranks.get(e.get("rank", -1))
        if rank is not None:
            rank.hung = False

    def _worker_exit(self, e: dict[str, Any]) -> None:
        rank = self._ranks.get(e.get("rank", -1))
        if rank is None:
            rank = self._ranks[e["rank"]] = _Rank(e["rank"], e.get("local_rank"), e.get("pid"))
        rank.state = "failed" if e.get("failed") else "exited"
        rank.returncode, rank.signal = e.get("returncode"), e.get("signal")

    def _failure(self, e: dict[str, Any]) -> None:
        self._info["last_failure"] = {name: e.get(name) for name in _FAILURE_FIELDS}
        self._info["state"] = "stopping"

    def _restart(self, e: dict[str, Any]) -> None:
        self._info.update(restarts=e.get("restart"), state="restarting")

    def _job_end(self, e: dict[str, Any]) -> None:
        self._info.update(
            state=e.get("outcome"),
            outcome=e.get("outcome"),
            exit_code=e.get("exit_code"),
            ended_at=e.get("t"),
        )


_HANDLERS: dict[str, Callable[[NodeStatus, dict[str, Any]], None]] = {
    "run_start": NodeStatus._run_start,
    "rdzv_start": NodeStatus._rdzv_start,
    "rdzv_done": NodeStatus._rdzv_done,
    "node_check": NodeStatus._node_check,
    "straggler": NodeStatus._straggler,
    "workers_started": NodeStatus._workers_started,
    "progress": NodeStatus._progress,
    "hang": NodeStatus._hang,
    "hang_over": NodeStatus._hang_over,
    "worker_exit": NodeStatus._worker_exit,
    "failure": NodeStatus._failure,
    "restart": NodeStatus._restart,
    "job_end": NodeStatus._job_end,
}
