"""The CLI end to end with real workers and real Gloo."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from support.launch import alive, end_all, run_phalanx, start_tree, wait_for, worker


def test_two_workers_all_reduce_and_exit_zero(tmp_path: Path) -> None:
    result = run_phalanx(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(tmp_path),
            worker("allreduce.py"),
        ]
    )
    assert result.returncode == 0, result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if "sum=" in line)
    assert lines == ["[rank0]: sum=3 rank=0 local=0", "[rank1]: sum=3 rank=1 local=1"]
    # Every rank's output is also in its own file, without the prefix.
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "attempt_0" / "rank_1" / "stdout.log").read_text() == "sum=3 rank=1 local=1\n"
    assert f"run directory: {run_dir}" in result.stderr


def test_failing_worker_exit_code_and_report(tmp_path: Path) -> None:
    result = run_phalanx(
        ["--nproc-per-node", "2", "--log-dir", str(tmp_path), worker("fail_rank.py"), "1", "7"]
    )
    assert result.returncode == 7, result.stderr
    report = result.stderr[result.stderr.index("=" * 78) :]
    assert "Root cause: rank 1 (local rank 1)" in report
    assert "exit code 7" in report
    assert "rank 1 giving up with 7" in report  # the tail of its stderr
    assert (
        "rank 0 (local rank 0) on" in report and "stopped by phalanx (killed by SIGTERM)" in report
    )
    (run_dir,) = tmp_path.iterdir()
    data = json.loads((run_dir / "report.json").read_text())
    assert [e["rank"] for e in data["exits"] if e["stopped_by_launcher"]] == [0]


def test_python_traceback_shows_in_report_without_decorator(tmp_path: Path) -> None:
    result = run_phalanx(
        ["--nproc-per-node", "2", "--log-dir", str(tmp_path), worker("raise_error.py")]
    )
    assert result.returncode == 1
    report = result.stderr[result.stderr.index("=" * 78) :]
    assert "Root cause: rank 1" in report
    assert "ValueError: bad learning rate 1e9" in report
    assert "Traceback (most recent call last)" in report


def test_signal_death_maps_to_128_plus_n(tmp_path: Path) -> None:
    script = tmp_path / "segv.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    result = run_phalanx(["--nproc-per-node", "1", "--log-dir", str(tmp_path), str(script)])
    assert result.returncode == 128 + signal.SIGSEGV
    assert "killed by SIGSEGV" in result.stderr


def test_kill_9_of_launcher_leaves_no_worker(tmp_path: Path) -> None:
    launcher, pids, _ = start_tree(tmp_path)
    try:
        assert all(alive(pid) for pid in pids)
        launcher.kill()
        launcher.wait(10)
        wait_for(
            lambda: not any(alive(pid) for pid in pids), 2, "workers and their children to die"
        )
    finally:
        end_all(launcher, pids)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_stops_everything(tmp_path: Path, signum: int, code: int) -> None:
    launcher, pids, _ = start_tree(tmp_path)
    try:
        launcher.send_signal(signum)
        assert launcher.wait(30) == code
        assert not any(alive(pid) for pid in pids)
    finally:
        end_all(launcher, pids)


def test_script_args_pass_through_untouched(tmp_path: Path) -> None:
    folder = tmp_path / "dir with 'quotes' and spaces"
    folder.mkdir()
    script = folder / "echo args.py"
    script.write_text(Path(worker("echo_args.py")).read_text())
    args = ["--nproc-per-node", "5", "--max-restarts=3", "-m", "x y", "--", "--standalone"]
    result = run_phalanx(
        ["--nproc_per_node=1", "--log-dir", str(tmp_path / "logs"), str(script), *args]
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout.split("]: ", 1)[1])
    assert data["argv"] == [str(script), *args]
    assert data["path0"] == str(folder)
    assert data["name"] == "__main__"


@pytest.mark.parametrize("flags", [["--run-path"], []])
def test_run_path_matches_plain_script(tmp_path: Path, flags: list[str]) -> None:
    script = Path(worker("echo_args.py")).resolve()
    result = run_phalanx([*flags, "--log-dir", str(tmp_path), str(script), "a", "--b"])
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout.split("]: ", 1)[1])
    assert data == {
        "argv": [str(script), "a", "--b"],
        "path0": str(script.parent),
        "name": "__main__",
        "rank": "0",
    }


def test_module_and_no_python_modes(tmp_path: Path) -> None:
    result = run_phalanx(["-m", "--log-dir", str(tmp_path), "json.tool", "--help"])
    assert result.returncode == 0 and "[rank0]: usage:" in result.stdout
    result = run_phalanx(
        [
            "--no-python",
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(tmp_path),
            "sh",
            "-c",
            "echo rank=$RANK",
        ]
    )
    assert result.returncode == 0
    assert sorted(result.stdout.split()) == ["[rank0]:", "[rank1]:", "rank=0", "rank=1"]


def test_local_ranks_filter_and_redirects(tmp_path: Path) -> None:
    result = run_phalanx(
        [
            "--nproc-per-node",
            "2",
            "--local-ranks-filter",
            "1",
            "--redirects",
            "1:2",
            "--log-dir",
            str(tmp_path),
            worker("echo_args.py"),
        ]
    )
    assert result.returncode == 0, result.stderr
    assert "[rank0]" not in result.stdout + result.stderr
    assert '[rank1]: {"argv"' in result.stdout
    assert "[rank1]: to stderr" not in result.stderr  # rank 1's stderr goes to its file only
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "attempt_0" / "rank_1" / "stderr.log").read_text() == "to stderr from 1\n"
    assert (run_dir / "attempt_0" / "rank_0" / "stderr.log").read_text() == "to stderr from 0\n"


def test_dry_run_prints_the_plan(tmp_path: Path) -> None:
    result = run_phalanx(["--dry-run", "--nproc-per-node", "2", worker("allreduce.py"), "--x"])
    assert result.returncode == 0, result.stderr
    assert "local rank 1 -> global rank 1" in result.stdout
    assert (
        "  WORLD_SIZE=2" in result.stdout
        and "  TORCHELASTIC_USE_AGENT_STORE=False" in result.stdout
    )
    assert "allreduce.py --x" in result.stdout


def test_restart_resumes_from_snapshot_bit_identical(tmp_path: Path) -> None:
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    clean.mkdir()
    crashed.mkdir()
    result = run_phalanx(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(tmp_path / "logs1"),
            worker("ddp_resume.py"),
            str(clean),
            "clean",
        ]
    )
    assert result.returncode == 0, result.stderr
    result = run_phalanx(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            "--log-dir",
            str(tmp_path / "logs2"),
            worker("ddp_resume.py"),
            str(crashed),
            "crash",
        ]
    )
    assert result.returncode == 0, result.stderr
    assert (
        "rank 1 (local rank 1) on" in result.stderr
        and "killed by SIGKILL (attempt 0)" in result.stderr
    )
    assert "restarting the worker group (restart 1 of 1)" in result.stderr
    assert "resumed at epoch" in result.stdout
    expected, actual = torch.load(clean / "final.pt"), torch.load(crashed / "final.pt")
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[key], actual[key]) for key in expected)


def test_restarted_workers_get_a_fresh_port_and_count(tmp_path: Path) -> None:
    script = tmp_path / "flaky.py"
    script.write_text(
        "import os, sys, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "print(os.environ['MASTER_PORT'], os.environ['TORCHELASTIC_RESTART_COUNT'], flush=True)\n"
        "dist.barrier()\n"
        "sys.exit(3 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' and dist.get_rank() == 0 else 0)\n"
    )
    result = run_phalanx(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "2",
            "--log-dir",
            str(tmp_path / "l"),
            str(script),
        ]
    )
    assert result.returncode == 0, result.stderr
    seen = {tuple(line.split(": ", 1)[1].split()) for line in result.stdout.splitlines()}
    ports = {port for port, _ in seen}
    assert {count for _, count in seen} == {"0", "1"} and len(ports) == 2


def test_crash_loop_stops_early(tmp_path: Path) -> None:
    result = run_phalanx(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "5",
            "--log-dir",
            str(tmp_path),
            worker("fail_rank.py"),
            "0",
            "4",
        ]
    )
    assert result.returncode == 4
    assert "crash loop" in result.stderr
    assert result.stderr.count("restarting the worker group") == 1
