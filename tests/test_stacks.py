"""``phalanx stacks RUN_DIR``: every rank's stack while the job runs; the job then finishes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from launch import PHALANX, run_phalanx, wait_for, worker


@pytest.mark.parametrize("mode", ["warm", "cold"])
def test_stacks_of_a_running_job_then_it_finishes(tmp_path: Path, mode: str) -> None:
    shared, logs = tmp_path / "shared", tmp_path / "logs"
    shared.mkdir()
    flags = ["--cold-start"] if mode == "cold" else []
    launcher = subprocess.Popen(
        [
            *PHALANX,
            *flags,
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(logs),
            worker("stacks_wait.py"),
            str(shared),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(lambda: len(list(shared.glob("ready.*"))) == 2, 90, "both ranks to start")
        (run_dir,) = logs.iterdir()
        for _ in range(2):  # twice: the launcher keeps answering, the job keeps running
            result = run_phalanx(["stacks", str(run_dir)], timeout=60)
            assert result.returncode == 0, result.stderr
            assert "stacks written to" in result.stderr
            for rank in (0, 1):
                assert f"=== rank {rank} (local rank {rank}, pid" in result.stdout
            # Both main threads are in the wait loop: the summary line and the dump show it.
            assert result.stdout.count("stacks_wait.py:9 in wait_for_go") >= 2, result.stdout
            assert 'stacks_wait.py", line 9 in wait_for_go' in result.stdout
        assert len(list(run_dir.glob("stacks_*.txt"))) == 2
        assert launcher.poll() is None
        # The launcher went back to sleep: no busy loop on the signal's wakeup byte (a spin
        # would burn about a CPU-second per second).
        agent = psutil.Process(launcher.pid)
        before = sum(agent.cpu_times()[:2])
        time.sleep(2)
        assert sum(agent.cpu_times()[:2]) - before < 0.8
        (shared / "go").touch()
        out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 0, err
        assert sorted(out.splitlines()) == ["[rank0]: done 0", "[rank1]: done 1"]
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()


def test_stacks_errors_are_one_line(tmp_path: Path) -> None:
    result = run_phalanx(["stacks", str(tmp_path / "nowhere")])
    assert result.returncode == 2 and "is not a phalanx run directory" in result.stderr
    assert "Traceback" not in result.stderr
    finished = run_phalanx(["--log-dir", str(tmp_path / "logs"), worker("echo_args.py")])
    assert finished.returncode == 0, finished.stderr
    (run_dir,) = (tmp_path / "logs").iterdir()
    result = run_phalanx(["stacks", str(run_dir)])
    assert result.returncode == 1 and "is not running" in result.stderr, result.stderr


def test_a_script_named_stacks_still_runs(tmp_path: Path) -> None:
    (tmp_path / "stacks").write_text("print('I am a script called stacks')\n")
    result = run_phalanx(["--log-dir", "logs", "stacks"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[rank0]: I am a script called stacks\n"
