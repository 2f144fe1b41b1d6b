"""A preemption on this node: one deadline for the whole job, the notice, the forwarding.

The deadline is ``--preempt-grace`` after this node heard of the preemption (its own signal,
or a peer's notice through the store, a fraction of a second later), timed on this host's
monotonic clock. The first node's wall clock travels in the notice (``report_preemption``)
for the report only: comparing it with this host's wall clock would let a skewed clock take
the grace away (a node 60 s ahead stopped its ranks at once) or lengthen it. At ``stop_at`` -- the deadline less a kill margin -- the supervisor stops whatever is
still running (SIGTERM, half the margin, SIGKILL), so the node is empty by the deadline.

Each worker is told twice: ``PREEMPT_NOTICE_FILE`` in its rank directory first (what
``phalanx.preempted()`` reads; robust to a script's own signal handlers), then the signal
itself, to the worker's main process only (its process group holds data-loader children,
which SIGUSR1's default action would kill). See ``phalanx.worker.preempt`` for the worker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from phalanx.errors import signal_name
from phalanx.plan import WorkerPlan
from phalanx.rendezvous.api import EventKind, JobEvent
from phalanx.worker.contract import PREEMPT_NOTICE_FILE, PREEMPT_SIGNALS_ENV, STOP_NOTICE_FILE
from phalanx.worker.nofollow import replace_file
from phalanx.worker.preempt import NOTICE_WAIT

log = logging.getLogger("phalanx")

# Tells the other nodes; returns the job's notice (``RendezvousHandler.report_preemption``).
Announce = Callable[[dict[str, object]], dict[str, object]]


def tell_stopping(workers: Iterable[WorkerPlan]) -> None:
    """Before phalanx's own SIGTERM: tell each worker that treats SIGTERM as a preemption
    that this one is a stop (``STOP_NOTICE_FILE``), so it acts at once, as without phalanx."""
    failed: list[str] = []
    for plan in workers:
        if "SIGTERM" in plan.env.get(PREEMPT_SIGNALS_ENV, "").split(","):
            try:
                replace_file(plan.log_dir / STOP_NOTICE_FILE, b"")
            except OSError as exc:  # then the worker waits its bound, no more
                failed.append(f"{plan.log_dir / STOP_NOTICE_FILE} ({exc.strerror or exc})")
    if failed:  # one line for the whole group (a full or read-only run directory)
        log.warning(
            "cannot write %s: those ranks wait up to %g s for a preemption notice before they stop",
            ", ".join(failed),
            NOTICE_WAIT,
        )


def kill_margin(grace: float) -> float:
    """How long before the deadline the supervisor stops the workers: 5 s, or a fifth of a
    short grace (SIGTERM, then SIGKILL after half of it, then a bounded reap)."""
    return min(5.0, grace / 5)


@dataclass(frozen=True)
class Preemption:
    signal: str  # the signal's name, as the first node got it
    time: float  # when the first node got it (that node's wall clock: for the report only)
    node: int | None  # which node (None: this one, before any round formed)
    grace: float
    deadline: float  # this host's time.monotonic()

    @property
    def stop_at(self) -> float:
        return self.deadline - kill_margin(self.grace)

    def notice(self) -> dict[str, object]:
        return {"signal": self.signal, "time": self.time, "node": self.node, "grace": self.grace}


def from_notice(notice: dict[str, object], grace: float) -> Preemption:
    """The job's preemption as this node sees it: ``grace`` (this node's own
    ``--preempt-grace``, which every node is given alike) from now, on this host's monotonic
    clock. Never from the notice's wall-clock time: that is another host's clock."""
    sent = notice.get("time")
    sent = float(sent) if isinstance(sent, (int, float)) else time.time()
    node = notice.get("node")
    return Preemption(
        signal=str(notice.get("signal", "")),
        time=sent,
        node=node if isinstance(node, int) else None,
        grace=grace,
        deadline=time.monotonic() + grace,
    )


class PreemptWatch:
    """The supervisor's side of a round under ``--preempt-signals``: ``begin`` (a signal
    here) or ``hear`` (a peer's ``PREEMPTED``), then ``due`` by ``stop_at``."""

    def __init__(
        self,
        grace: float,
        announce: Announce,
        node_rank: int,
        on_start: Callable[[Preemption], None] = lambda preemption: None,
    ) -> None:
        """``on_start``: called once, when this node's preemption begins (the event log)."""
        self._grace = grace
        self._announce = announce
        self._on_start = on_start
        self._node_rank = node_rank
        self.preemption: Preemption | None = None
        self.forwarded: int | None = None  # the signal the workers were sent
        self._signalled = False  # this node got a preemption signal (a second one stops)

    def begin(self, signum: int, running: Sequence[tuple[WorkerPlan, int]]) -> bool:
        """A preemption signal to this node. Returns False when this node had one already:
        a second signal during the grace stops the workers at once.

        This node's first signal may come after a peer's notice: a scheduler signals every
        node (``scancel --signal``, a pod's SIGTERM), and which reaches this agent first,
        the signal or the notice through the store, is a race a loaded host decides. That
        signal is not a second one: the preemption under way keeps its deadline."""
        if self._signalled:
            return False
        self._signalled = True
        name = signal_name(signum)
        if self.preemption is not None:
            log.warning(
                "preempted: %s here too, after node %s's notice; the job's deadline stands",
                name, self.preemption.node,
            )  # fmt: skip
            return True
        log.warning(
            "preempted: %s; the workers have %g s to save and exit (--preempt-grace)",
            name, self._grace,
        )  # fmt: skip
        mine = {"signal": name, "time": time.time(), "node": self._node_rank, "grace": self._grace}
        self._start(from_notice(self._announce(mine), self._grace), signum, running)
        return True

    def hear(self, event: JobEvent, running: Sequence[tuple[WorkerPlan, int]]) -> None:
        """A peer's ``PREEMPTED``: the same deadline here (the earlier one if both began)."""
        assert event.kind is EventKind.PREEMPTED
        heard = from_notice(dict(event.failure), self._grace)
        if self.preemption is not None:
            if heard.deadline < self.preemption.deadline:
                self.preemption = heard
            return
        log.warning("preempted: %s; the workers have until the job's deadline", event.detail)
        sig = getattr(signal.Signals, heard.signal, signal.SIGTERM)
        self._start(heard, int(sig), running)

    def due(self) -> bool:
        return self.preemption is not None and time.monotonic() >= self.preemption.stop_at

    def wait_bound(self) -> float | None:
        """Seconds until ``stop_at`` (None: no preemption)."""
        if self.preemption is None:
            return None
        return max(0.0, self.preemption.stop_at - time.monotonic())

    def _start(
        self, preemption: Preemption, signum: int, running: Sequence[tuple[WorkerPlan, int]]
    ) -> None:
        self.preemption = preemption
        self.forwarded = signum
        self._on_start(preemption)
        body = json.dumps({**preemption.notice(), "stop_at": preemption.stop_at}).encode()
        for plan, pid in running:
            try:
                replace_file(plan.log_dir / PREEMPT_NOTICE_FILE, body)
            except OSError as exc:
                log.warning("cannot write the preemption notice of %s: %s", plan.name, exc)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
