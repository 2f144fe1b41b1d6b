"""What is checked before and during a round: the nodes, their code, stragglers, hangs."""

from __future__ import annotations

from dataclasses import dataclass, field

from phalanx.nodecheck.settings import CheckSettings
from phalanx.stragglers.settings import StragglerSettings


@dataclass(frozen=True)
class ChecksConfig:
    # Seconds without progress after which the ranks are declared hung (stacks dumped, a
    # hang report written, the round failed); None (the default, --stall-timeout 0) is off.
    stall_timeout: float | None = None
    # --node-check, --node-check-thresholds, --checkpoint-dir: the check before every round
    # of a multi-node job (phalanx.nodecheck); a single node skips it.
    node_check: CheckSettings = field(default_factory=CheckSettings)
    # --straggler-action/-fraction/-window: ranks whose step rate stays below their peers'
    # while training (phalanx.stragglers.watch).
    stragglers: StragglerSettings = field(default_factory=StragglerSettings)
    # Start even when the nodes' code or versions differ (a warning with the table instead
    # of stopping the job: phalanx.consistency).
    allow_mismatch: bool = False
