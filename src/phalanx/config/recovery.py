"""How a run recovers: its restart budget, preemption, and the exclusion of bad nodes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RecoveryConfig:
    max_restarts: int = 0
    # Signals that mean "you will be stopped" (a preemption, not an interrupt): forwarded to
    # every worker of every node, which then have ``preempt_grace`` seconds in all, counted
    # from the first node's signal; then the job exits REQUEUE_EXIT_CODE (75).
    preempt_signals: tuple[str, ...] = ()
    preempt_grace: float = 25.0
    requeue: bool = False  # under SLURM, node rank 0 runs ``scontrol requeue`` after one
    # A node whose worker is the job's root cause this many failed rounds in a row is
    # excluded (0: never); exclusions go to the run directory's file and to exclude_file,
    # and a node listed in exclude_file is refused at start (phalanx.exclusion).
    exclude_after: int = 0
    exclude_file: Path | None = None
