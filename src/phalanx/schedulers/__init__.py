"""The schedulers phalanx's command line reads its node facts from (``detect``)."""

from phalanx.schedulers.detect import CHOICES, SCHEDULERS, detect, detect_as
from phalanx.schedulers.facts import Detected, Fact, Problem, slurm_port

__all__ = [
    "CHOICES",
    "SCHEDULERS",
    "Detected",
    "Fact",
    "Problem",
    "detect",
    "detect_as",
    "slurm_port",
]
