"""Which scheduler started this process: a table, tried in order, the first match wins.

=====================  ==========================================  ===========================
scheduler              marker variables (all set)                  module
=====================  ==========================================  ===========================
openmpi                OMPI_COMM_WORLD_SIZE/_RANK/_LOCAL_SIZE      ``mpi``
pmi                    PMI_SIZE, PMI_RANK, MPI_LOCALNRANKS         ``mpi``
slurm                  SLURM_JOB_ID                                ``slurm``
kubeflow-pytorchjob    KUBERNETES_SERVICE_HOST, MASTER_ADDR,       ``kubeflow``
                       WORLD_SIZE, RANK
kubeflow-trainer       KUBERNETES_SERVICE_HOST,                    ``kubeflow``
                       JOB_COMPLETION_INDEX, PET_MASTER_ADDR
=====================  ==========================================  ===========================

The innermost launcher comes first: ``mpirun`` inside an ``sbatch`` script starts processes
that also carry the batch step's ``SLURM_*``, but ``OMPI_COMM_WORLD_*`` say what mpirun
started. ``srun --mpi=pmi2`` sets ``PMI_RANK``/``PMI_SIZE`` but not Hydra's
``MPI_LOCALNRANKS``, so it stays a Slurm step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from phalanx.environments import kubeflow, mpi, slurm, torchrun
from phalanx.environments.facts import Detected, LauncherVars


@dataclass(frozen=True)
class Scheduler:
    name: str
    markers: tuple[str, ...]  # all set only in a process this scheduler started
    read: Callable[[Mapping[str, str]], Detected]  # pure

    def matches(self, env: Mapping[str, str]) -> bool:
        return all(env.get(var, "").strip() for var in self.markers)


SCHEDULERS: tuple[Scheduler, ...] = (
    Scheduler("openmpi", mpi.markers("openmpi"), partial(mpi.read, "openmpi")),
    Scheduler("pmi", mpi.markers("pmi"), partial(mpi.read, "pmi")),
    Scheduler("slurm", slurm.MARKERS, slurm.read),
    Scheduler("kubeflow-pytorchjob", kubeflow.PYTORCHJOB_MARKERS, kubeflow.read_pytorchjob),
    Scheduler("kubeflow-trainer", kubeflow.TRAINER_MARKERS, kubeflow.read_trainer),
)
CHOICES = ("auto", "none", *(s.name for s in SCHEDULERS))  # --scheduler

# What a worker's launcher told it (``inscript.envs.read_launch_env``), tried in order; the
# first whose marker is set wins, so a torchrun started inside ``srun`` counts as torchrun.
LAUNCHERS: tuple[LauncherVars, ...] = (torchrun.LAUNCHER, slurm.LAUNCHER, *mpi.LAUNCHERS)


def detect(env: Mapping[str, str]) -> Detected | None:
    """Pure: what the first scheduler whose markers are all set says, or None."""
    found = next((s for s in SCHEDULERS if s.matches(env)), None)
    return None if found is None else found.read(env)


def detect_as(choice: str, env: Mapping[str, str]) -> Detected | None:
    """``--scheduler``: ``auto`` detects, ``none`` turns detection off, a name reads that
    scheduler's variables (``ValueError`` when its markers are not all set, or for an
    unknown name, listing the known ones)."""
    if choice == "auto":
        return detect(env)
    if choice == "none":
        return None
    chosen = next((s for s in SCHEDULERS if s.name == choice), None)
    if chosen is None:
        raise ValueError(f"--scheduler: unknown scheduler {choice!r}; known: {', '.join(CHOICES)}")
    if not chosen.matches(env):
        missing = ", ".join(var for var in chosen.markers if not env.get(var, "").strip())
        raise ValueError(f"--scheduler {choice}: not under {choice} ({missing} not set)")
    return chosen.read(env)


def preempt_signals(choice: str, env: Mapping[str, str]) -> tuple[str, ...]:
    """The preemption signals of a job started in ``env`` under ``--scheduler choice`` (pure):
    Slurm's, Kubernetes' (any pod when detecting), or none."""
    try:
        found = detect_as(choice, env)
    except ValueError:  # --scheduler NAME not matching: its own check reports it
        found = None
    name = found.scheduler if found is not None else ""
    if name == "slurm":
        return slurm.PREEMPT_SIGNALS
    pod = choice == "auto" and bool(env.get(kubeflow.POD_MARKER, "").strip())
    if name.startswith("kubeflow") or (found is None and pod):
        return kubeflow.PREEMPT_SIGNALS
    return ()
