"""What a user reads at the end of a job, through the real CLI: attempts numbered as their
directories, the cause said once (the report ends the output), the recovery lines in words,
and a run without ``--rdzv-id`` not called 'none'."""

from __future__ import annotations

import json
from pathlib import Path

from phalanx.resources.ports import free_port
from support.launch import run_phalanx, worker

FRAME = "=" * 78


def test_a_failed_job_says_its_cause_once_with_attempts_as_directories(tmp_path: Path) -> None:
    done = run_phalanx(["--nproc-per-node", "2", "--max-restarts", "1", "--log-dir",
                        str(tmp_path), worker("raise_error.py")])  # fmt: skip
    assert done.returncode == 1, done.stderr
    (run_dir,) = tmp_path.iterdir()
    assert sorted(p.name for p in run_dir.glob("attempt_*")) == ["attempt_0", "attempt_1"]
    own = [line for line in done.stderr.splitlines() if not line.startswith("[rank")]
    # Each failure's line names its attempt as its directory does.
    failed = [line for line in own if line.endswith("[exception]") and "(attempt" in line]
    assert [line.split("(attempt ")[1] for line in failed] == ["0) [exception]", "1) [exception]"]
    assert f"logs: {run_dir}/attempt_1/rank_1" in done.stderr
    # The report comes last: the cause is not repeated after it.
    assert own[-1] == FRAME, own[-3:]
    assert sum("Root cause: rank 1" in line for line in own) == 1
    said = [line for line in own if line.startswith("phalanx: rank 1 (local rank 1) on ")]
    assert not any(line.endswith(": ValueError: bad learning rate 1e9") for line in said), said
    recovery = [line for line in own if line.startswith("phalanx: recovery: ")]
    assert recovery and own.index(recovery[-1]) < own.index(FRAME)
    assert "never made progress again; " in recovery[0], recovery
    assert not any("?" in line or "beats" in line or "re-form" in line for line in recovery)


def test_a_run_without_rdzv_id_is_not_called_none(tmp_path: Path) -> None:
    """A static node 1 whose node 0 never comes: a real (failed) run, its id torchrun's
    default; ``--dry-run`` and ``status`` say no id was given."""
    port = free_port()
    args = ["--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "static", "--master-addr",
            "127.0.0.1", "--master-port", str(port), "--rdzv-conf", "join_timeout=2",
            "--log-dir", str(tmp_path), worker("echo_args.py")]  # fmt: skip
    planned = run_phalanx(["--dry-run", *args], timeout=60)
    assert planned.returncode == 0, planned.stderr
    assert "run id (no --rdzv-id given), node 1 of 2" in planned.stdout, planned.stdout
    done = run_phalanx(args, timeout=60)
    assert done.returncode == 1, done.stderr
    (run_dir,) = tmp_path.iterdir()
    shown = run_phalanx(["status", str(run_dir)], timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("run (no --rdzv-id given): failed"), shown.stdout
    assert json.loads(run_phalanx(["status", str(run_dir), "--json"]).stdout)["nodes"]
