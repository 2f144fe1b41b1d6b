"""Kubeflow: a PyTorchJob of training-operator v1, and a TrainJob of Kubeflow Trainer (JobSet).

torchrun's ``PET_<FLAG>`` variables are read by the parser, as every flag's default, for
every job (``cli.parser``); these rows add only what a pod says in other words, so each
fact has one source:

* PyTorchJob v1 (Master + Worker replicas) sets ``MASTER_ADDR``, ``MASTER_PORT``, and a
  node-level ``WORLD_SIZE`` (the replicas) and ``RANK`` (the replica's index, the master 0):
  those are ``--nnodes``, ``--node-rank`` and the static store's address. An elastic policy
  adds ``PET_RDZV_BACKEND``/``PET_RDZV_ENDPOINT``/``PET_NNODES``, which then win (the parser
  reads them); the static facts are dropped when the backend is not static. The workers
  never see the node-level ``RANK``/``WORLD_SIZE``: their own are set per rank.
* Trainer's torch plugin sets ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``
  (from ``JOB_COMPLETION_INDEX``), ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT``, which are
  torchrun's static rendezvous; phalanx's default backend is c10d, so the row says static
  (and takes ``JOB_COMPLETION_INDEX`` when ``PET_NODE_RANK`` is missing).

``KUBERNETES_SERVICE_HOST`` (in every pod) is part of both markers, so a ``RANK`` left in a
shell elsewhere is not mistaken for a pod.
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx.environments.facts import Detected, Fact, Problem

# A pod's deletion sends SIGTERM, then SIGKILL after terminationGracePeriodSeconds; in any
# pod, not only Kubeflow's (KUBERNETES_SERVICE_HOST is in every one).
POD_MARKER = "KUBERNETES_SERVICE_HOST"
PREEMPT_SIGNALS = ("SIGTERM",)
PYTORCHJOB_MARKERS = ("KUBERNETES_SERVICE_HOST", "MASTER_ADDR", "WORLD_SIZE", "RANK")
TRAINER_MARKERS = ("KUBERNETES_SERVICE_HOST", "JOB_COMPLETION_INDEX", "PET_MASTER_ADDR")

# The PyTorchJob's node-level variable -> the flag it stands for.
_PYTORCHJOB_FLAGS = (
    ("WORLD_SIZE", "nnodes"),
    ("RANK", "node_rank"),
    ("MASTER_ADDR", "master_addr"),
    ("MASTER_PORT", "master_port"),
)


def read_pytorchjob(env: Mapping[str, str]) -> Detected:
    facts = [
        Fact(dest, env[var].strip(), f"{var}, the PyTorchJob's node-level variable")
        for var, dest in _PYTORCHJOB_FLAGS
        if env.get(var, "").strip()
    ]
    problems = []
    if "MASTER_PORT" not in env:
        problems.append(Problem("kubeflow-pytorchjob: MASTER_PORT is not set", ("master_port",)))
    if env["WORLD_SIZE"].strip() != "1":
        facts.append(Fact("rdzv_backend", "static", "RANK and WORLD_SIZE: fixed node ranks"))
    return Detected("kubeflow-pytorchjob", tuple(facts), tuple(problems))


def read_trainer(env: Mapping[str, str]) -> Detected:
    facts = [Fact("rdzv_backend", "static", "PET_MASTER_ADDR and a node rank: torchrun's static")]
    if "PET_NODE_RANK" not in env:
        facts.append(Fact("node_rank", env["JOB_COMPLETION_INDEX"].strip(), "JOB_COMPLETION_INDEX"))
    return Detected("kubeflow-trainer", tuple(facts))
