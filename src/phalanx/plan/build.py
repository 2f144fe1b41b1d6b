"""The plan of one round: per worker its argv, environment and log paths (plain data).

Everything here is a pure function of its inputs; the supervisor only carries the plan out
and ``--dry-run`` prints it. The environment is ``plan.env``'s, the argv ``plan.command``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from string import Template

from phalanx.config import LaunchConfig, shown_run_id
from phalanx.plan.command import WorkerCommand, spawn_owner_command, worker_command
from phalanx.plan.env import job_env, rank_dir, worker_env
from phalanx.rendezvous.api import RendezvousResult
from phalanx.rendezvous.credentials import worker_environment


@dataclass(frozen=True)
class WorkerPlan:
    local_rank: int
    global_rank: int
    command: WorkerCommand
    env: Mapping[str, str]
    log_dir: Path
    console_streams: frozenset[str]  # which of stdout/stderr also go to the console
    label: str = ""  # console prefix and report name: "rank3", or "node1" for a spawn owner
    prefix: str = ""  # before each console line; "": "[<name>]: " (``line_prefix``)

    @property
    def console_prefix(self) -> str:
        return self.prefix or f"[{self.name}]: "

    @property
    def argv(self) -> tuple[str, ...]:
        return self.command.argv

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


def build_plan(
    config: LaunchConfig,
    rdzv: RendezvousResult,
    run_dir: Path,
    base_env: Mapping[str, str],
) -> RoundPlan:
    attempt_dir = run_dir / f"attempt_{rdzv.restart_count}"
    if config.workers.spawn_owner:
        workers: tuple[WorkerPlan, ...] = (_owner_plan(config, rdzv, run_dir, base_env),)
    else:
        command = worker_command(config.workers)  # the same argv for every local rank
        workers = tuple(
            _worker_plan(config, rdzv, run_dir, base_env, command, local_rank)
            for local_rank in range(config.workers.nproc_per_node)
        )
    return RoundPlan(run_dir=run_dir, attempt_dir=attempt_dir, rendezvous=rdzv, workers=workers)


def _owner_plan(
    config: LaunchConfig, rdzv: RendezvousResult, run_dir: Path, base_env: Mapping[str, str]
) -> WorkerPlan:
    """One process per node; it spawns the workers itself, so it gets no RANK/WORLD_SIZE
    (a script that checks for them would think it is a worker), only the job facts."""
    return WorkerPlan(
        local_rank=0,
        global_rank=rdzv.node_rank,
        command=spawn_owner_command(config.workers, rdzv),
        env={**worker_environment(base_env), **job_env(config.recovery, rdzv, run_dir)},
        log_dir=run_dir / f"attempt_{rdzv.restart_count}" / f"node_{rdzv.node_rank}",
        console_streams=frozenset({"stdout", "stderr"}) - config.logs.redirects.get(0, frozenset()),
        label=f"node{rdzv.node_rank}",
    )


def _worker_plan(
    config: LaunchConfig,
    rdzv: RendezvousResult,
    run_dir: Path,
    base_env: Mapping[str, str],
    command: WorkerCommand,
    local_rank: int,
) -> WorkerPlan:
    rank = rdzv.rank_offset + local_rank
    shown = config.logs.local_ranks_filter is None or local_rank in config.logs.local_ranks_filter
    console = frozenset({"stdout", "stderr"}) - config.logs.redirects.get(local_rank, frozenset())
    return WorkerPlan(
        local_rank=local_rank,
        global_rank=rank,
        command=command,
        env=worker_env(config, rdzv, local_rank, run_dir, base_env),
        log_dir=rank_dir(run_dir, rdzv.restart_count, rank),
        console_streams=console if shown else frozenset(),
        prefix=line_prefix(config, rank, local_rank),
    )


def line_prefix(config: LaunchConfig, rank: int, local_rank: int) -> str:
    """The prefix of a worker's console lines: torchrun's template when one is set
    (``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``, substituted as torchrun does), else ""
    (the plan's default, ``[rankN]: ``)."""
    if config.logs.log_line_prefix_template is None:
        return ""
    return Template(config.logs.log_line_prefix_template).safe_substitute(
        role_name=config.workers.role, rank=rank, local_rank=local_rank
    )


def describe(plan: RoundPlan, base_env: Mapping[str, str]) -> str:
    """Human-readable plan for ``--dry-run``: per local rank, the argv and what phalanx sets."""
    rdzv = plan.rendezvous
    lines = [
        f"run id {shown_run_id(rdzv.run_id, quote=False)}, node {rdzv.node_rank} of {rdzv.num_nodes}, world size {rdzv.world_size}",
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
        for key in sorted(k for k in base_env if k not in worker.env):
            lines.append(f"  {key} not passed on")
    return "\n".join(lines)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
