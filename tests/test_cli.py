"""Command-line parsing: flags, PET_* fallbacks, and bad input (exit 2, one line, no traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.cli.main import parse_config
from phalanx.config import LaunchMode
from phalanx.errors import UsageError
from support.launch import PHALANX, worker

SCRIPT = worker("allreduce.py")


def test_both_spellings_and_defaults() -> None:
    dashed = parse_config(["--nproc-per-node", "3", "--max-restarts", "2", SCRIPT], {})
    underscored = parse_config(["--nproc_per_node=3", "--max_restarts=2", SCRIPT], {})
    assert dashed == underscored
    assert (dashed.nproc_per_node, dashed.max_restarts, dashed.min_nodes, dashed.max_nodes) == (
        3,
        2,
        1,
        1,
    )
    assert dashed.mode is LaunchMode.SCRIPT and dashed.rdzv_backend == "c10d"


def test_pet_environment_fallbacks() -> None:
    env = {
        "PET_NPROC_PER_NODE": "2",
        "PET_MAX_RESTARTS": "4",
        "PET_STANDALONE": "1",
        "PET_RDZV_ID": "job",
    }
    config = parse_config([SCRIPT], env)
    assert (config.nproc_per_node, config.max_restarts, config.standalone, config.rdzv_id) == (
        2,
        4,
        True,
        "job",
    )
    assert parse_config(["--max-restarts", "1", SCRIPT], env).max_restarts == 1  # the flag wins


def test_nproc_per_node_cpu_and_auto_without_gpu() -> None:
    import os

    assert parse_config(["--nproc-per-node", "cpu", SCRIPT], {}).nproc_per_node == os.cpu_count()
    assert parse_config(["--nproc-per-node", "auto", SCRIPT], {}).nproc_per_node == os.cpu_count()
    with pytest.raises(UsageError, match="no CUDA device"):
        parse_config(["--nproc-per-node", "gpu", SCRIPT], {})


def test_everything_after_the_script_belongs_to_it() -> None:
    config = parse_config(
        ["--nproc-per-node", "2", SCRIPT, "--nproc-per-node", "9", "-m", "--", "x"], {}
    )
    assert config.nproc_per_node == 2
    assert config.program_args == ("--nproc-per-node", "9", "-m", "--", "x")


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(UsageError) as caught:
        parse_config(
            ["--nproc-per-node", "0", "--nnodes", "3:2", "--max-restarts", "-1", "missing.py"], {}
        )
    assert len(caught.value.problems) == 4


BAD_INPUTS = [
    (["--nproc-per-node", "0", SCRIPT], "--nproc-per-node: expected an integer >= 1, got 0"),
    (["--nnodes", "3:2", SCRIPT], "--nnodes: MIN must not exceed MAX"),
    (["--nnodes", "x", SCRIPT], "--nnodes: expected N or MIN:MAX"),
    (["missing_script.py"], "training script not found: 'missing_script.py'"),
    (
        ["--rdzv-backend", "zookeeper", SCRIPT],
        "unknown backend 'zookeeper'; known: c10d, etcd, etcd-v2, static",
    ),
    (["--rdzv-endpoint", "a:b:c", SCRIPT], "--rdzv-endpoint: expected host[:port]"),
    (["--max-restarts", "-1", SCRIPT], "--max-restarts: expected an integer >= 0, got -1"),
    (["--max-restarts", "two", SCRIPT], "--max-restarts: expected an integer, got 'two'"),
    (["--master-port", "1.5", SCRIPT], "--master-port: expected an integer"),
    (["--monitor-interval", "fast", SCRIPT], "--monitor-interval: expected a number"),
    (["--nproc-per-node", "2", "--redirects", "7", SCRIPT], "--redirects: expected 0 (none)"),
    (
        ["--local-ranks-filter", "a,b", SCRIPT],
        "--local-ranks-filter: expected comma-separated ranks",
    ),
    (["--rdzv-conf", "novalue", SCRIPT], "--rdzv-conf: expected key=value"),
    (["--signals-to-handle", "SIGNOPE", SCRIPT], "unknown signal 'SIGNOPE'"),
    (["--no-python", "no-such-program-xyz"], "is not an executable file or on PATH"),
    (["--signals-to-handle", "SIGTERM,SIGKILL", SCRIPT], "SIGKILL cannot be caught"),
    (["--monitor-interval", "inf", SCRIPT], "--monitor-interval: expected a finite number"),
    (["--shutdown-timeout", "inf", SCRIPT], "--shutdown-timeout: expected a finite number"),
    (["--stall-timeout", "nan", SCRIPT], "--stall-timeout: expected a finite number"),
    (["--log-dir", "/proc/self/no/such", SCRIPT], "cannot make the run directory there"),
    (["--bogus-flag", SCRIPT], "unrecognized arguments: --bogus-flag"),
    ([], "the following arguments are required: training_script"),
]


@pytest.mark.parametrize(
    ("args", "message"), BAD_INPUTS, ids=[" ".join(a[:2]) for a, _ in BAD_INPUTS]
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [*PHALANX, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("phalanx: error: ") and message in lines[0]
    assert done.stdout == ""


def test_help_explains() -> None:
    done = subprocess.run([*PHALANX, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for text in (
        "--nproc-per-node NPROC_PER_NODE, --nproc_per_node",
        "--standalone",
        "--max-restarts",
        "exit status",
        "--dry-run",
    ):
        assert text in done.stdout
    version = subprocess.run(
        [sys.executable, "-c", "import phalanx; print(phalanx.__version__)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert version.stdout.strip() == "0.1.0"


def test_torchrun_flags_accepted_but_not_applied_are_said_at_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [*PHALANX, "--numa-binding", "node", "--log-dir", str(tmp_path), worker("echo_args.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "--numa-binding node is not applied" in done.stderr
    assert parse_config([SCRIPT], {}).not_applied == ()
