"""Preemption settings: the defaults per environment, the flags, what --dry-run shows, and
what a worker is told (pure tables, plus the real CLI for --dry-run)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from phalanx.cli.argv import parse_config
from phalanx.cli.preempt import DEFAULT_GRACE, default_signals
from phalanx.config import LaunchConfig, RecoveryConfig, WorkersConfig
from phalanx.plan import worker_env
from phalanx.rendezvous.api import NodeInfo, RendezvousResult
from phalanx.worker.contract import PREEMPT_SIGNALS_ENV
from support.launch import PHALANX, worker

SCRIPT = worker("echo_args.py")


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, ()),
        ({"SLURM_JOB_ID": "12"}, ("SIGUSR1", "SIGTERM")),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, ("SIGTERM",)),
        ({"SLURM_JOB_ID": "", "KUBERNETES_SERVICE_HOST": ""}, ()),
    ],
)
def test_default_signals_follow_the_environment(
    environ: dict[str, str], expected: tuple[str, ...]
) -> None:
    assert default_signals(environ) == expected
    assert parse_config([SCRIPT], environ).recovery.preempt_signals == expected


@pytest.mark.parametrize(
    ("flag", "expected"),
    [("USR1", ("SIGUSR1",)), ("sigusr1,SIGTERM", ("SIGUSR1", "SIGTERM")), ("none", ())],
)
def test_preempt_signals_flag_wins_over_the_default(flag: str, expected: tuple[str, ...]) -> None:
    config = parse_config(["--preempt-signals", flag, SCRIPT], {"SLURM_JOB_ID": "12"})
    assert config.recovery.preempt_signals == expected


def test_grace_default_and_flag() -> None:
    assert parse_config([SCRIPT], {}).recovery.preempt_grace == DEFAULT_GRACE
    assert parse_config(["--preempt_grace", "80", SCRIPT], {}).recovery.preempt_grace == 80.0
    assert parse_config(["--requeue", SCRIPT], {"SLURM_JOB_ID": "1"}).recovery.requeue


def test_dry_run_shows_the_preemption_settings(tmp_path: Path) -> None:
    args = ["--dry-run", "--preempt-signals", "SIGUSR1", "--preempt-grace", "80", "--requeue"]
    done = subprocess.run(
        [*PHALANX, *args, SCRIPT], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert (
        "preemption: SIGUSR1 forwarded to every worker of every node; --preempt-grace 80 s "
        "from the first node's signal; exit 75; then scontrol requeue (node rank 0)"
    ) in done.stdout
    assert f"{PREEMPT_SIGNALS_ENV}=SIGUSR1" in done.stdout
    markers = ("SLURM_JOB_ID", "KUBERNETES_SERVICE_HOST", "PET_PREEMPT_SIGNALS")
    env = {k: v for k, v in os.environ.items() if k not in markers}
    off = subprocess.run(
        [*PHALANX, "--dry-run", SCRIPT], capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env=env,
    )  # fmt: skip
    assert "preemption: off" in off.stdout, off.stderr


def test_the_worker_is_told_the_signals_only_when_there_are_some() -> None:
    rdzv = RendezvousResult("job", 0, 0, 0, (NodeInfo(0, "h", "a", 1),), "a", 1)
    plain = worker_env(LaunchConfig(WorkersConfig(program="t.py")), rdzv, 0, Path("/r"), {})
    assert PREEMPT_SIGNALS_ENV not in plain
    config = LaunchConfig(
        WorkersConfig(program="t.py"),
        recovery=RecoveryConfig(preempt_signals=("SIGUSR1", "SIGTERM")),
    )
    env = worker_env(config, rdzv, 0, Path("/r"), {})
    assert env[PREEMPT_SIGNALS_ENV] == "SIGUSR1,SIGTERM"


def test_the_default_follows_the_scheduler_flag() -> None:
    """``--scheduler none`` reads no scheduler, so no default preemption signals either."""
    slurm = {"SLURM_JOB_ID": "12"}
    assert default_signals(slurm, "none") == ()
    assert parse_config(["--scheduler", "none", SCRIPT], slurm).recovery.preempt_signals == ()
    pytorchjob = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "MASTER_ADDR": "m", "WORLD_SIZE": "2",
                  "RANK": "0"}  # fmt: skip
    assert default_signals(pytorchjob) == ("SIGTERM",)
