"""Command-line parsing: flags, PET_* fallbacks, and bad input (exit 2, one line, no traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.cli.argv import parse_config
from phalanx.cli.parser import build_parser
from phalanx.config import LaunchMode
from phalanx.errors import UsageError
from support.launch import PHALANX, worker

SCRIPT = worker("allreduce.py")


def test_both_spellings_and_defaults() -> None:
    dashed = parse_config(["--nproc-per-node", "3", "--max-restarts", "2", SCRIPT], {})
    underscored = parse_config(["--nproc_per_node=3", "--max_restarts=2", SCRIPT], {})
    assert dashed == underscored
    assert (
        dashed.workers.nproc_per_node,
        dashed.recovery.max_restarts,
        dashed.rendezvous.min_nodes,
        dashed.rendezvous.max_nodes,
    ) == (
        3,
        2,
        1,
        1,
    )
    assert dashed.workers.mode is LaunchMode.SCRIPT and dashed.rendezvous.rdzv_backend == "c10d"


def test_pet_environment_fallbacks() -> None:
    env = {
        "PET_NPROC_PER_NODE": "2",
        "PET_MAX_RESTARTS": "4",
        "PET_STANDALONE": "1",
        "PET_RDZV_ID": "job",
    }
    config = parse_config([SCRIPT], env)
    assert (
        config.workers.nproc_per_node,
        config.recovery.max_restarts,
        config.rendezvous.standalone,
        config.rendezvous.rdzv_id,
    ) == (
        2,
        4,
        True,
        "job",
    )
    assert (
        parse_config(["--max-restarts", "1", SCRIPT], env).recovery.max_restarts == 1
    )  # the flag wins


def test_nproc_per_node_cpu_and_auto_without_gpu() -> None:
    import os

    assert (
        parse_config(["--nproc-per-node", "cpu", SCRIPT], {}).workers.nproc_per_node
        == os.cpu_count()
    )
    assert (
        parse_config(["--nproc-per-node", "auto", SCRIPT], {}).workers.nproc_per_node
        == os.cpu_count()
    )
    with pytest.raises(UsageError, match="no CUDA device"):
        parse_config(["--nproc-per-node", "gpu", SCRIPT], {})


def test_everything_after_the_script_belongs_to_it() -> None:
    config = parse_config(
        ["--nproc-per-node", "2", SCRIPT, "--nproc-per-node", "9", "-m", "--", "x"], {}
    )
    assert config.workers.nproc_per_node == 2
    assert config.workers.program_args == ("--nproc-per-node", "9", "-m", "--", "x")


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(UsageError) as caught:
        parse_config(
            ["--nproc-per-node", "0", "--nnodes", "3:2", "--max-restarts", "-1", "missing.py"], {}
        )
    assert len(caught.value.problems) == 4


# One case per bad value; the first argument is the option under test (the case's id, and
# what ``test_every_option_with_a_value_has_a_bad_value_case`` counts). Later ones only set
# the scene.
MULTI = ["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1"]  # refused before any contact
BAD_INPUTS = [
    (["--nproc-per-node", "0", SCRIPT], "--nproc-per-node: expected an integer >= 1, got 0"),
    (
        ["--nproc-per-node", "x", SCRIPT],
        "--nproc-per-node: expected a positive integer, auto, cpu, gpu or xpu, got 'x'",
    ),
    (["--nnodes", "3:2", SCRIPT], "--nnodes: MIN must not exceed MAX"),
    (["--nnodes", "x", SCRIPT], "--nnodes: expected N or MIN:MAX"),
    (["missing_script.py"], "training script not found: 'missing_script.py'"),
    (["."], "training script '.' is a directory; give the script in it"),
    (
        ["--rdzv-backend", "zookeeper", SCRIPT],
        "unknown backend 'zookeeper'; known: c10d, etcd, etcd-v2, static",
    ),
    (["--rdzv-endpoint", "a:b:c", SCRIPT], "--rdzv-endpoint: expected host[:port]"),
    (["--rdzv-endpoint", "host:99999", SCRIPT], "--rdzv-endpoint: port must be 0..65535"),
    (["--rdzv-id", "a/b", SCRIPT], "--rdzv-id 'a/b': expected letters, digits"),
    (["--rdzv-id", "a b", *MULTI, SCRIPT], "--rdzv-id 'a b': expected letters, digits"),
    (["--rdzv-conf", "novalue", SCRIPT], "--rdzv-conf: expected key=value"),
    (["--rdzv-conf", "join_timeout=abc", SCRIPT], "join_timeout=abc: expected a positive number"),
    (["--rdzv-conf", "bogus=1", *MULTI, SCRIPT], "--rdzv-conf bogus: unknown key for static"),
    (
        ["--rdzv-conf", "protocol=ftp", "--rdzv-backend", "etcd", *MULTI, SCRIPT],
        "--rdzv-conf protocol=ftp: expected http or https",
    ),
    (["--max-restarts", "-1", SCRIPT], "--max-restarts: expected an integer >= 0, got -1"),
    (["--max-restarts", "two", SCRIPT], "--max-restarts: expected an integer, got 'two'"),
    (["--master-port", "1.5", SCRIPT], "--master-port: expected an integer"),
    (["--master-port", "70000", SCRIPT], "--master-port: expected 0..65535, got 70000"),
    (["--master-addr", "a b", SCRIPT], "--master-addr: expected a host name or an IP address"),
    (["--local-addr", "", SCRIPT], "--local-addr: expected a host name or an IP address"),
    (["--node-rank", "x", SCRIPT], "--node-rank: expected an integer, got 'x'"),
    (["--node-rank", "-1", SCRIPT], "--node-rank: expected an integer >= 0, got -1"),
    (
        ["--node-rank", "5", "--rdzv-backend", "static", "--nnodes", "2", SCRIPT],
        "--node-rank 5: expected 0..1 for --nnodes 2",
    ),
    (["--monitor-interval", "fast", SCRIPT], "--monitor-interval: expected a number"),
    (["--monitor-interval", "inf", SCRIPT], "--monitor-interval: expected a finite number"),
    (["--start-method", "nope", SCRIPT], "invalid choice: 'nope'"),
    (["--event-log-handler", "bogus", SCRIPT], "--event-log-handler: expected null or console"),
    (["--redirects", "7", "--nproc-per-node", "2", SCRIPT], "--redirects: expected 0 (none)"),
    (["--redirects", "0:x", SCRIPT], "--redirects: expected an integer, got 'x'"),
    (["--tee", "7", SCRIPT], "--tee: expected 0 (none)"),
    (
        ["--local-ranks-filter", "a,b", SCRIPT],
        "--local-ranks-filter: expected comma-separated ranks",
    ),
    (
        ["--logs-specs", "mine", SCRIPT],
        "--logs-specs: could not find entrypoint under 'torchrun.logs_specs[mine]'",
    ),
    (["--numa-binding", "x", SCRIPT], "invalid choice: 'x'"),
    (["--signals-to-handle", "SIGNOPE", SCRIPT], "unknown signal 'SIGNOPE'"),
    (["--signals-to-handle", "SIGTERM,SIGKILL", SCRIPT], "SIGKILL cannot be caught"),
    (["--preempt-signals", "SIGNOPE", SCRIPT], "--preempt-signals: unknown signal 'SIGNOPE'"),
    (["--preempt-signals", "SIGKILL", SCRIPT], "--preempt-signals: SIGKILL cannot be caught"),
    (["--preempt-signals", "SIGINT", SCRIPT], "--preempt-signals: SIGINT stays an interrupt"),
    (["--preempt-signals", ",", SCRIPT], "--preempt-signals: expected SIG[,SIG...] or none"),
    (["--preempt-grace", "0", SCRIPT], "--preempt-grace: expected a number of seconds > 0"),
    (["--preempt-grace", "soon", SCRIPT], "--preempt-grace: expected a number"),
    (["--requeue", "--preempt-signals", "none", SCRIPT], "--requeue needs preemption signals"),
    (["--shutdown-timeout", "inf", SCRIPT], "--shutdown-timeout: expected a finite number"),
    (["--shutdown-timeout", "-1", SCRIPT], "--shutdown-timeout: expected a number >= 0"),
    (["--stall-timeout", "nan", SCRIPT], "--stall-timeout: expected a finite number"),
    (["--keep-warm", "x", SCRIPT], "--keep-warm: expected a number, got 'x'"),
    (["--keep-warm", "-5", SCRIPT], "--keep-warm: expected a number >= 0, got -5.0"),
    (["--keep-warm", "nan", SCRIPT], "--keep-warm: expected a finite number of seconds"),
    (["--hang-watch", "maybe", SCRIPT], "--hang-watch: expected on, off, or floor=60,factor"),
    (["--hang-watch", "floor=x", SCRIPT], "--hang-watch: floor must be a number, got 'x'"),
    (["--hang-watch", "factor=0.5", SCRIPT], "--hang-watch: factor must be 1 or more, got 0.5"),
    (["--hang-watch", "grace=0", SCRIPT], "--hang-watch: grace must be above 0, got 0"),
    (
        ["--hang-watch", "floor=5", "--stall-timeout", "9", SCRIPT],
        "--hang-watch and --stall-timeout: give one",
    ),
    (["--exclude-after", "x", SCRIPT], "--exclude-after: expected an integer, got 'x'"),
    (["--exclude-after", "-1", SCRIPT], "--exclude-after: expected an integer >= 0, got -1"),
    (["--exclude-file", "/", SCRIPT], "--exclude-file /: a directory, expected a file"),
    (["--preload", "a..b", SCRIPT], "--preload: 'a..b' is not a module name"),
    (["--spawn-owner-flags", "bogus", SCRIPT], "--spawn-owner-flags: expected key=value"),
    (["--spawn-owner-flags", "x=--y", SCRIPT], "--spawn-owner-flags: unknown fact(s) x"),
    (["--log-dir", "/proc/self/no/such", SCRIPT], "cannot make the run directory there"),
    (["--no-python", "no-such-program-xyz"], "is not an executable file or on PATH"),
    (["--bogus-flag", SCRIPT], "unrecognized arguments: --bogus-flag"),
    ([], "the following arguments are required: training_script"),
    (["--hostfile", "absent.txt", SCRIPT], "--hostfile absent.txt: cannot read it"),
    (["--hosts", "h1:0", SCRIPT], "--hosts 'h1:0': expected a worker count of 1 or more"),
    (["--ssh-config", "nope", "--hosts", "h1", SCRIPT], "--ssh-config: no such file: nope"),
    (["--env", "PHX_UNSET_XYZ", "--hosts", "h1", SCRIPT], "not set in this environment"),
    (["--env-file", "absent.env", "--hosts", "h1", SCRIPT], "--env-file absent.env: cannot"),
    (
        ["--node-check", "maybe", SCRIPT],
        "invalid choice: 'maybe' (choose from 'off', 'warn', 'exclude')",
    ),
    (
        ["--node-check-thresholds", "speed=3", SCRIPT],
        "--node-check-thresholds: 'speed=3': expected key=value with a key of",
    ),
    (
        ["--straggler-action", "kill", SCRIPT],
        "invalid choice: 'kill' (choose from 'off', 'warn', 'exclude')",
    ),
    (
        ["--straggler-fraction", "1.5", SCRIPT],
        "--straggler-fraction: expected a number between 0 and 1",
    ),
    (["--straggler-fraction", "x", SCRIPT], "--straggler-fraction: expected a number, got 'x'"),
    (["--straggler-window", "0", SCRIPT], "--straggler-window: expected seconds above 0, got 0"),
    (["--metrics-port", "x", SCRIPT], "--metrics-port: expected an integer, got 'x'"),
    (["--metrics-port", "0", SCRIPT], "--metrics-port: expected an integer >= 1, got 0"),
    (["--metrics-port", "70000", SCRIPT], "--metrics-port: expected 1..65535, got 70000"),
    (["--worker-port", "x", SCRIPT], "--worker-port: expected an integer, got 'x'"),
    (["--worker-port", "0", SCRIPT], "--worker-port: expected an integer >= 1, got 0"),
    (["--worker-port", "70000", SCRIPT], "--worker-port: expected 1..65535, got 70000"),
    (["--metrics-addr", "a b", SCRIPT], "--metrics-addr: expected a host name or an IP address"),
    (["--scheduler", "pbs", SCRIPT], "--scheduler: unknown scheduler 'pbs'; known: auto, none, "),
    (["--scheduler", "slurm", SCRIPT], "--scheduler slurm: not under slurm (SLURM_JOB_ID not set)"),
]

# Options that take a value of which none is bad, and why.
ANY_VALUE = {
    "--role": "a free-form name (ROLE_NAME), as in torchrun",
    "--duplicate-stdout-filters": "free-form words to look for in the output",
    "--duplicate-stderr-filters": "free-form words to look for in the output",
    "--checkpoint-dir": "any path: the node check makes sure it is writable and not full",
}


def test_every_option_with_a_value_has_a_bad_value_case() -> None:
    """Generated from the parser: a new option that takes a value fails this test until it
    has a case in ``BAD_INPUTS`` (or a reason in ``ANY_VALUE``)."""
    tested = {args[0] for args, _ in BAD_INPUTS if args} | set(ANY_VALUE)
    untested = [
        action.option_strings
        for action in build_parser({})._actions
        if action.option_strings and action.nargs != 0 and not tested & set(action.option_strings)
    ]
    assert untested == []


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
        "--metrics-port METRICS_PORT",
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
