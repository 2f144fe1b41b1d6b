"""What is checked before and during a round: the nodes, their code, stragglers, hangs."""

from __future__ import annotations

from dataclasses import dataclass, field

from phalanx.hang.settings import HangWatch
from phalanx.nodecheck.settings import CheckSettings
from phalanx.stragglers.settings import StragglerSettings


@dataclass(frozen=True)
class ChecksConfig:
    # Seconds without progress after which the ranks are declared hung (stacks dumped, a
    # hang report written, the round failed); None (the default, --stall-timeout 0) is off.
    stall_timeout: float | None = None
    # --hang-watch (on by default; None: off): a rank silent well past its own rhythm is
    # named, with every rank's stack; the round fails only at a second, longer bound
    # (phalanx.hang.rhythm). A stall timeout replaces it; --spawn-owner and --no-python
    # workers, whose progress phalanx cannot see, are not watched.
    hang_watch: HangWatch | None = field(default_factory=HangWatch)
    # --node-check, --node-check-thresholds, --checkpoint-dir: the check before every round
    # of a multi-node job (phalanx.nodecheck); a single node skips it.
    node_check: CheckSettings = field(default_factory=CheckSettings)
    # --straggler-action/-fraction/-window: ranks whose step rate stays below their peers'
    # while training (phalanx.stragglers.watch).
    stragglers: StragglerSettings = field(default_factory=StragglerSettings)
    # Start even when the nodes' code or versions differ (a warning with the table instead
    # of stopping the job: phalanx.consistency).
    allow_mismatch: bool = False
