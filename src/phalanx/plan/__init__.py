"""Plan, then execute: config + rendezvous result -> per-worker argv, environment, log paths."""

from phalanx.plan.build import RoundPlan, WorkerPlan, build_plan, describe
from phalanx.plan.command import (
    WORKER_BOOT,
    WorkerCommand,
    spawn_owner_command,
    worker_command,
)
from phalanx.plan.env import WORKER_ENV_KEYS, job_env, node_env, rank_dir, worker_env

__all__ = [
    "WORKER_BOOT",
    "WORKER_ENV_KEYS",
    "RoundPlan",
    "WorkerCommand",
    "WorkerPlan",
    "build_plan",
    "describe",
    "job_env",
    "node_env",
    "rank_dir",
    "spawn_owner_command",
    "worker_command",
    "worker_env",
]
