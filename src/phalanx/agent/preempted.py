"""The end of a preempted job on one node: its report (the requeue under SLURM is
``environments.slurm.requeue``).

A preemption is not a failure: no restart is spent, the report says "preempted" (when the
first node got which signal, the last step this node's ranks reached, which ranks ended on
their own and which were stopped at the deadline) and the agent exits ``REQUEUE_EXIT_CODE``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from phalanx.errors import REQUEUE_EXIT_CODE
from phalanx.plan import RoundPlan
from phalanx.supervisor.exits import WorkerExit
from phalanx.supervisor.preempt import Preemption
from phalanx.tick import Reading

log = logging.getLogger("phalanx")
_SCONTROL_TIMEOUT = 30.0


def last_step(plan: RoundPlan) -> int | None:
    """The highest ``phalanx.step(n)`` this node's ranks reached (None: none called it)."""
    return Reading.take(plan.workers).last_step()


def report(
    preemption: Preemption, exits: Sequence[WorkerExit], step: int | None, node_rank: int
) -> tuple[str, dict[str, object]]:
    """The framed summary and ``report.json`` of a preempted node."""
    stopped = sorted(e.rank for e in exits if e.stopped_by_launcher)
    saved = sorted(e.rank for e in exits if e.returncode == 0)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(preemption.time))
    where = "this node" if preemption.node in (None, node_rank) else f"node {preemption.node}"
    rule = "=" * 78
    lines = [
        rule,
        f"phalanx: job preempted ({preemption.signal} on {where} at {when}, "
        f"grace {preemption.grace:g} s); exit {REQUEUE_EXIT_CODE}, to be run again",
        f"  last step on this node: {_step(step, exits)}",
        f"  ranks that exited on their own: {_ranks(saved)}",
        f"  ranks stopped at the deadline: {_ranks(stopped)}",
        rule,
    ]
    data: dict[str, object] = {
        "preempted": {
            **preemption.notice(),
            "step": step,
            "exited": saved,
            "stopped_at_deadline": stopped,
        },
        "exit_code": REQUEUE_EXIT_CODE,
        "exits": [e.to_json() for e in exits],
    }
    return "\n".join(lines), data


def _step(step: int | None, exits: Sequence[WorkerExit]) -> str:
    if step is not None:
        return str(step)
    # No exits: the preemption came before the round's workers started (``agent.loop``).
    return "unknown (no phalanx.step)" if exits else "none: no worker started in this round"


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks) if ranks else "none"
