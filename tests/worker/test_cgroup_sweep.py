"""The job's cgroup is not left behind by a worker stuck in the kernel (state D).

phalanx cannot remove a cgroup while a process stuck in the kernel is still in it, and it
does not wait for one (the launcher exits within its bound, the worker named in the report).
Once the process finally dies the cgroup is empty, and the next phalanx run on the machine
sweeps it -- never a cgroup that still holds a process (a live run's, or one still stuck),
never one that is not named as a job's cgroup. Real processes, the real cgroup-v1 freezer
(state D), the real cgroup hierarchies phalanx uses (v2 and v1 ``pids`` where mounted).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.supervisor.cgroup import hierarchies
from support.freezer import frozen
from support.launch import PHALANX, alive, remove_job_cgroups, run_phalanx, wait_for, worker

HANG = 60.0  # bounds that only catch a hang


def _job_cgroups(run_dir: Path) -> list[Path]:
    return [p for root in hierarchies() if (p := root / f"phalanx-{run_dir.name}").exists()]


def _procs(group: Path) -> list[int]:
    return [int(pid) for pid in (group / "cgroup.procs").read_text().split()]


@pytest.fixture
def others(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Two cgroups beside the jobs' that a sweep must keep: one named as a job's cgroup but
    holding a live process, one empty but not named as a job's cgroup."""
    root = hierarchies()[0]
    busy = root / f"phalanx-busy-{os.getpid()}_0123abcd"
    foreign = root / f"phalanx-test-keep-{os.getpid()}"
    busy.mkdir()
    foreign.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (busy / "cgroup.procs").write_text(str(sleeper.pid))
        yield busy, foreign
    finally:
        sleeper.kill()
        sleeper.wait(10)
        wait_for(lambda: not _procs(busy), 10, "the sleeper to leave its cgroup")
        busy.rmdir()
        foreign.rmdir()


def _sweeping_run(tmp_path: Path, name: str) -> None:
    """Another phalanx run on this machine (the sweep happens as it starts)."""
    result = run_phalanx(["--log-dir", str(tmp_path / name), "--no-python", "true"], timeout=HANG)
    assert result.returncode == 0, result.stderr


def test_a_cgroup_left_by_a_worker_stuck_in_the_kernel_is_swept_by_the_next_run(
    tmp_path: Path, others: tuple[Path, Path]
) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    args = ["--log-dir", str(tmp_path / "logs"), "--nproc-per-node", "2",
            "--shutdown-timeout", "1", "--cold-start", worker("freeze_me.py"), str(folder)]  # fmt: skip
    launcher = subprocess.Popen(
        [*PHALANX, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    busy, foreign = others
    try:
        wait_for(lambda: (folder / "victim.pid").exists(), HANG, "rank 1 to start")
        victim = int((folder / "victim.pid").read_text())
        (run_dir,) = (tmp_path / "logs").iterdir()
        (job,) = _job_cgroups(run_dir)
        _sweeping_run(tmp_path, "while-live")
        assert job.exists() and launcher.poll() is None, "a live run's cgroup is kept"
        with frozen(victim, f"phalanx-test-{os.getpid()}-sweep"):
            started = time.monotonic()
            (folder / "go").touch()
            _, stderr = launcher.communicate(timeout=HANG)
            # The figure docs/explanation/faults.md gives (not asserted: a loaded machine).
            print(f"launcher exited {time.monotonic() - started:.1f} s after the failure")
            assert launcher.returncode == 3, stderr
            assert "still in state D (disk sleep) after SIGKILL" in stderr, stderr
            assert _procs(job) == [victim], "the stuck worker keeps the cgroup"
            _sweeping_run(tmp_path, "while-stuck")
            assert job.exists(), "a cgroup that still holds a process is never removed"
        # Empty once thawed: from then on any phalanx run that starts on this machine may sweep
        # it (the suite runs others beside this test: ci58 lost it to one), so it is empty or gone.
        assert alive(victim) is False and (not job.exists() or not _procs(job))
        _sweeping_run(tmp_path, "after")
        assert not _job_cgroups(run_dir), "the empty cgroup of the ended job is swept"
        assert busy.exists() and foreign.exists(), "only empty job cgroups are swept"
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate(timeout=10)
        remove_job_cgroups(tmp_path / "logs")  # what a failed assertion above left
