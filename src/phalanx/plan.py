"""Plan, then execute: config + rendezvous result -> per-worker argv, environment, log paths.

Everything here is a pure function of its inputs; the supervisor only carries the plan out
and ``--dry-run`` prints it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from phalanx.config import LaunchConfig, LaunchMode
from phalanx.rendezvous.api import RendezvousResult

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
# phalanx's one addition: where phalanx.checkpoint records completed checkpoints, so the
# agent can tell a crash loop (same failure, no new checkpoint) from progress.
CHECKPOINT_LOG_ENV = "PHALANX_CHECKPOINT_LOG"


@dataclass(frozen=True)
class WorkerPlan:
    local_rank: int
    global_rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_dir: Path
    console_streams: frozenset[str]  # which of stdout/stderr also go to the console
    label: str = ""  # console prefix and report name: "rank3", or "node1" for a spawn owner

    @property
    def name(self) -> str:
        return self.label or f"rank{self.global_rank}"

    @property
    def stdout_path(self) -> Path:
        return self.log_dir / "stdout.log"

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / "stderr.log"

    @property
    def error_file(self) -> Path:
        return self.log_dir / "error.json"


@dataclass(frozen=True)
class RoundPlan:
    run_dir: Path
    attempt_dir: Path
    rendezvous: RendezvousResult
    workers: tuple[WorkerPlan, ...]


# Every python worker runs phalanx's worker-side code first (progress counters for hang
# detection, stack dumps on SIGUSR2), then the user's program; see phalanx.worker.boot.
WORKER_BOOT = ("-m", "phalanx.worker.boot")


def worker_command(
    config: LaunchConfig, python: str = sys.executable, *, boot: bool = True
) -> tuple[str, ...]:
    """The argv every worker runs (the same on every rank): torchrun's command, with
    ``-m phalanx.worker.boot`` before the program when ``boot`` (``--no-python`` programs
    run as given)."""
    args = config.program_args
    if config.mode is LaunchMode.NO_PYTHON:
        return (config.program, *args)
    entry = WORKER_BOOT if boot else ()
    if config.mode is LaunchMode.MODULE:
        return (python, "-u", *entry, "-m", config.program, *args)
    if config.mode is LaunchMode.RUN_PATH:
        return (
            python,
            "-u",
            *entry,
            "-m",
            "phalanx.worker.run_path",
            str(Path(config.program).resolve()),
            *args,
        )
    return (python, "-u", *entry, config.program, *args)


def worker_env(
    config: LaunchConfig,
    rdzv: RendezvousResult,
    local_rank: int,
    run_dir: Path,
    base_env: Mapping[str, str],
) -> dict[str, str]:
    """The whole environment of one worker: ``base_env`` plus torchrun 2.13's variables.

    ``TORCHELASTIC_USE_AGENT_STORE`` is ``False`` because phalanx hosts no store for the
    workers: global rank 0 hosts it at MASTER_ADDR:MASTER_PORT (a fresh port every round).
    That also keeps a user's own ``tcp://`` init_method working: with ``True``, torch turns
    every rank into a client and rank 0 waits for a server nobody starts.
    """
    rank = rdzv.rank_offset + local_rank
    # In the rank's log directory, which is how the worker-side code finds that directory
    # (phalanx.worker.boot.rank_dir): no variable beyond torchrun's is needed for it.
    error_file = worker_log_dir(run_dir, rdzv.restart_count, rank) / "error.json"
    env = dict(base_env)
    if config.nproc_per_node > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = "1"  # torchrun's default, so N workers do not oversubscribe
    env.update(
        RANK=str(rank),
        LOCAL_RANK="0" if config.virtual_local_rank else str(local_rank),
        GROUP_RANK=str(rdzv.node_rank),
        ROLE_RANK=str(rank),
        ROLE_NAME=config.role,
        LOCAL_WORLD_SIZE=str(config.nproc_per_node),
        WORLD_SIZE=str(rdzv.world_size),
        GROUP_WORLD_SIZE=str(rdzv.num_nodes),
        ROLE_WORLD_SIZE=str(rdzv.world_size),
        MASTER_ADDR=rdzv.master_addr,
        MASTER_PORT=str(rdzv.master_port),
        TORCHELASTIC_USE_AGENT_STORE=str(False),
        TORCHELASTIC_ERROR_FILE=str(error_file),
        TORCHELASTIC_SIGNALS_TO_HANDLE=",".join(config.signals_to_handle),
        TORCH_NCCL_ASYNC_ERROR_HANDLING=base_env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    )
    env.update(job_env(config, rdzv, run_dir))
    if config.virtual_local_rank:
        visible = base_env.get("CUDA_VISIBLE_DEVICES")
        devices = visible.split(",") if visible else [str(i) for i in range(config.nproc_per_node)]
        env["CUDA_VISIBLE_DEVICES"] = devices[local_rank].strip()
    return env


def job_env(config: LaunchConfig, rdzv: RendezvousResult, run_dir: Path) -> dict[str, str]:
    """What every process phalanx starts is told about the job (workers and spawn owners)."""
    return {
        "TORCHELASTIC_RESTART_COUNT": str(rdzv.restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(config.max_restarts),
        "TORCHELASTIC_RUN_ID": rdzv.run_id,
        CHECKPOINT_LOG_ENV: str(run_dir / "checkpoints.jsonl"),
    }


def spawn_owner_argv(config: LaunchConfig, rdzv: RendezvousResult) -> tuple[str, ...]:
    """The worker command plus this node's facts as flags (TRELLIS.2's names by default)."""
    facts = {
        "num_nodes": rdzv.num_nodes,
        "node_rank": rdzv.node_rank,
        "num_gpus": config.nproc_per_node,
        "master_addr": rdzv.master_addr,
        "master_port": rdzv.master_port,
    }
    extra = (part for fact, flag in config.spawn_owner_flags for part in (flag, str(facts[fact])))
    # The owner is not a rank (its workers are its own children): no worker-side code.
    return (*worker_command(config, boot=False), *extra)


def worker_log_dir(run_dir: Path, restart_count: int, rank: int) -> Path:
    return run_dir / f"attempt_{restart_count}" / f"rank_{rank}"


def build_plan(
    config: LaunchConfig,
    rdzv: RendezvousResult,
    run_dir: Path,
    base_env: Mapping[str, str],
) -> RoundPlan:
    attempt_dir = run_dir / f"attempt_{rdzv.restart_count}"
    if config.spawn_owner:
        # One process per node; it spawns the workers itself, so it gets no RANK/WORLD_SIZE
        # (a script that checks for them would think it is a worker), only the job facts.
        owner = WorkerPlan(
            local_rank=0,
            global_rank=rdzv.node_rank,
            argv=spawn_owner_argv(config, rdzv),
            env={**base_env, **job_env(config, rdzv, run_dir)},
            log_dir=attempt_dir / f"node_{rdzv.node_rank}",
            console_streams=frozenset({"stdout", "stderr"}) - config.redirects.get(0, frozenset()),
            label=f"node{rdzv.node_rank}",
        )
        return RoundPlan(
            run_dir=run_dir, attempt_dir=attempt_dir, rendezvous=rdzv, workers=(owner,)
        )
    argv = worker_command(config)
    workers = []
    for local_rank in range(config.nproc_per_node):
        rank = rdzv.rank_offset + local_rank
        log_dir = worker_log_dir(run_dir, rdzv.restart_count, rank)
        shown = config.local_ranks_filter is None or local_rank in config.local_ranks_filter
        console = frozenset({"stdout", "stderr"}) - config.redirects.get(local_rank, frozenset())
        workers.append(
            WorkerPlan(
                local_rank=local_rank,
                global_rank=rank,
                argv=argv,
                env=worker_env(config, rdzv, local_rank, run_dir, base_env),
                log_dir=log_dir,
                console_streams=console if shown else frozenset(),
            )
        )
    return RoundPlan(
        run_dir=run_dir, attempt_dir=attempt_dir, rendezvous=rdzv, workers=tuple(workers)
    )


def describe(plan: RoundPlan, base_env: Mapping[str, str]) -> str:
    """Human-readable plan for ``--dry-run``: per local rank, the argv and what phalanx sets."""
    rdzv = plan.rendezvous
    lines = [
        f"run id {rdzv.run_id}, node {rdzv.node_rank} of {rdzv.num_nodes}, world size {rdzv.world_size}",
        f"run directory {plan.run_dir}",
    ]
    for worker in plan.workers:
        lines.append(
            f"local rank {worker.local_rank} -> global rank {worker.global_rank} ({worker.name})"
        )
        lines.append(f"  argv: {' '.join(_quote(a) for a in worker.argv)}")
        changed = {k: v for k, v in worker.env.items() if base_env.get(k) != v}
        for key in sorted(changed):
            lines.append(f"  {key}={changed[key]}")
    return "\n".join(lines)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
