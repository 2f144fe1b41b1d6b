"""The environment of each worker: torchrun 2.13's variables, built in one place."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from phalanx.config import LaunchConfig, RecoveryConfig, WorkersConfig
from phalanx.rendezvous.api import RendezvousResult
from phalanx.rendezvous.credentials import worker_environment
from phalanx.worker.contract import CHECKPOINT_LOG_ENV, CHECKPOINT_LOG_FILE, PREEMPT_SIGNALS_ENV

# Variables phalanx sets for every worker (torchrun 2.13's set); everything else is inherited.
WORKER_ENV_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
)


def node_env(workers: WorkersConfig, base_env: Mapping[str, str]) -> dict[str, str]:
    """What every worker of this node shares, and so what the warm-start template is started
    with: ``base_env`` and torchrun's ``OMP_NUM_THREADS=1`` when several workers share the
    node (the OpenMP runtime reads it once, when torch loads it). The secrets phalanx reads
    (``phalanx.rendezvous.credentials``) are not passed on."""
    env = worker_environment(base_env)
    if workers.nproc_per_node > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = "1"  # torchrun's default, so N workers do not oversubscribe
    return env


def worker_env(
    config: LaunchConfig,
    rdzv: RendezvousResult,
    local_rank: int,
    run_dir: Path,
    base_env: Mapping[str, str],
) -> dict[str, str]:
    """The whole environment of one worker: ``node_env`` plus torchrun 2.13's variables.

    ``TORCHELASTIC_USE_AGENT_STORE`` is ``False`` because phalanx hosts no store for the
    workers: global rank 0 hosts it at MASTER_ADDR:MASTER_PORT (a fresh port every round,
    or ``--worker-port`` in every round).
    That also keeps a user's own ``tcp://`` init_method working: with ``True``, torch turns
    every rank into a client and rank 0 waits for a server nobody starts.
    """
    rank = rdzv.rank_offset + local_rank
    # In the rank's log directory, which is how the worker-side code finds that directory
    # (phalanx.worker.contract.rank_dir): no variable beyond torchrun's is needed for it.
    error_file = rank_dir(run_dir, rdzv.restart_count, rank) / "error.json"
    env = node_env(config.workers, base_env)
    env.update(
        RANK=str(rank),
        LOCAL_RANK="0" if config.workers.virtual_local_rank else str(local_rank),
        GROUP_RANK=str(rdzv.node_rank),
        ROLE_RANK=str(rank),
        ROLE_NAME=config.workers.role,
        LOCAL_WORLD_SIZE=str(config.workers.nproc_per_node),
        WORLD_SIZE=str(rdzv.world_size),
        GROUP_WORLD_SIZE=str(rdzv.num_nodes),
        ROLE_WORLD_SIZE=str(rdzv.world_size),
        MASTER_ADDR=rdzv.master_addr,
        MASTER_PORT=str(rdzv.master_port),
        TORCHELASTIC_USE_AGENT_STORE=str(False),
        TORCHELASTIC_ERROR_FILE=str(error_file),
        TORCHELASTIC_SIGNALS_TO_HANDLE=",".join(config.workers.signals_to_handle),
        TORCH_NCCL_ASYNC_ERROR_HANDLING=base_env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    )
    env.update(job_env(config.recovery, rdzv, run_dir))
    if config.workers.virtual_local_rank:
        visible = base_env.get("CUDA_VISIBLE_DEVICES")
        devices = (
            visible.split(",")
            if visible
            else [str(i) for i in range(config.workers.nproc_per_node)]
        )
        env["CUDA_VISIBLE_DEVICES"] = devices[local_rank].strip()
    return env


def job_env(recovery: RecoveryConfig, rdzv: RendezvousResult, run_dir: Path) -> dict[str, str]:
    """What every process phalanx starts is told about the job (workers and spawn owners);
    the preemption signals only when there are some (the worker absorbs them during a
    preemption's grace: ``phalanx.worker.preempt``)."""
    env = {
        "TORCHELASTIC_RESTART_COUNT": str(rdzv.restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(recovery.max_restarts),
        "TORCHELASTIC_RUN_ID": rdzv.run_id,
        CHECKPOINT_LOG_ENV: str(run_dir / CHECKPOINT_LOG_FILE),
    }
    if recovery.preempt_signals:
        env[PREEMPT_SIGNALS_ENV] = ",".join(recovery.preempt_signals)
    return env


def rank_dir(run_dir: Path, restart_count: int, rank: int) -> Path:
    """Where a rank's logs, error file, progress counters and stacks are, per attempt."""
    return run_dir / f"attempt_{restart_count}" / f"rank_{rank}"
