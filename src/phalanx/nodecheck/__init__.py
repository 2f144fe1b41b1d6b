"""The node check before every round of a multi-node job, and ``phalanx check``."""

from phalanx.nodecheck.round import Skipped, check_round
from phalanx.nodecheck.settings import Action, CheckSettings, Thresholds
from phalanx.nodecheck.verdict import Verdict, judge, table

__all__ = [
    "Action", "CheckSettings", "Skipped", "Thresholds", "Verdict", "check_round", "judge", "table",
]  # fmt: skip
