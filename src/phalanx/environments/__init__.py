"""The environments phalanx runs in, one module each (Slurm, Kubeflow, MPI, torchrun): what
each says about this node (``detect``, for the command line), what it tells each worker
(``LAUNCHERS``, for ``phalanx.init``), its preemption signals and requeue."""

from phalanx.environments.detect import (
    CHOICES,
    LAUNCHERS,
    SCHEDULERS,
    detect,
    detect_as,
    preempt_signals,
)
from phalanx.environments.facts import Detected, Fact, LauncherVars, Problem, slurm_port

__all__ = [
    "CHOICES",
    "LAUNCHERS",
    "SCHEDULERS",
    "Detected",
    "Fact",
    "LauncherVars",
    "Problem",
    "detect",
    "detect_as",
    "preempt_signals",
    "slurm_port",
]
