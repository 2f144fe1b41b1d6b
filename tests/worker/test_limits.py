"""A launch that runs into a resource limit ends as a failure the user can act on: exit 1, one
line naming the limit and how to raise it, ``report.json`` and a ``job_end`` event, no
traceback. The limits are real: ``RLIMIT_NOFILE`` set on the launcher before it starts, and
a v1 ``pids`` cgroup of the test's own with a small ``pids.max``. A low soft descriptor limit
under a high hard one is no failure at all: the agent raises soft to hard at start."""

from __future__ import annotations

import contextlib
import json
import os
import resource
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from phalanx.events.log import EVENTS_FILE
from support.launch import run_phalanx, worker

WORKERS = 8
PIDS_ROOT = Path("/sys/fs/cgroup/pids")


def _nofile(soft: int, hard: int) -> Callable[[], None]:
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return preexec


def _args(tmp_path: Path, extra: list[str]) -> list[str]:
    return [
        *extra, "--nproc-per-node", str(WORKERS), "--log-dir", str(tmp_path / "logs"),
        worker("echo_args.py"),
    ]  # fmt: skip


def _assert_failed_on_limit(stderr: str, code: int, tmp_path: Path, limit: str) -> None:
    assert code == 1, stderr
    assert "Traceback" not in stderr, stderr
    assert "reporting SIGKILL" not in stderr, stderr  # workers phalanx stopped itself
    last = stderr.rstrip().splitlines()[-1]
    assert last.startswith("phalanx: cannot start rank "), stderr
    assert limit in last, stderr
    (run_dir,) = (tmp_path / "logs").iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["outcome"] == "failed", report
    assert limit in report["ended"], report
    events = [json.loads(line) for line in (run_dir / EVENTS_FILE).read_text().splitlines()]
    assert events[-1]["kind"] == "job_end", events[-1]
    assert (events[-1]["outcome"], events[-1]["exit_code"]) == ("failed", 1), events[-1]


@pytest.mark.parametrize("start", ["warm", "cold"])
def test_too_few_descriptors_fail_the_round_with_one_line(start: str, tmp_path: Path) -> None:
    extra = ["--cold-start"] if start == "cold" else []
    result = run_phalanx(_args(tmp_path, extra), preexec_fn=_nofile(40, 40))
    _assert_failed_on_limit(
        result.stderr,
        result.returncode,
        tmp_path,
        "too many open files (RLIMIT_NOFILE soft=40 hard=40)",
    )
    assert "raise it with ulimit -n" in result.stderr


def test_a_low_soft_descriptor_limit_is_raised_to_the_hard_one(tmp_path: Path) -> None:
    result = run_phalanx(_args(tmp_path, []), preexec_fn=_nofile(20, 4096))
    assert result.returncode == 0, result.stderr
    assert f"all {WORKERS} workers finished" in result.stderr


@contextlib.contextmanager
def _pids_cgroup(limit: int) -> Iterator[Path]:
    """A v1 ``pids`` cgroup of this test's own (named with its pid), removed afterwards."""
    if not os.access(PIDS_ROOT, os.W_OK):
        pytest.skip(f"no writable v1 pids hierarchy at {PIDS_ROOT}")
    group = PIDS_ROOT / f"phalanx-test-limits-{os.getpid()}"
    group.mkdir()
    try:
        (group / "pids.max").write_text(f"{limit}\n")
        yield group
    finally:
        # The launcher's job cgroup (a child of this one) is removed by phalanx; only then
        # can this one be. Everything in it has exited by now (run_phalanx waited).
        for child in sorted(group.iterdir(), reverse=True):
            if child.is_dir():
                with contextlib.suppress(OSError):
                    child.rmdir()
        group.rmdir()


def test_too_few_processes_fail_the_round_with_one_line(tmp_path: Path) -> None:
    # Threads count too: the launcher's own and its log writers leave no room for 8 workers.
    with _pids_cgroup(10) as group:

        def join() -> None:
            (group / "cgroup.procs").write_text(f"{os.getpid()}\n")

        result = run_phalanx(_args(tmp_path, ["--cold-start"]), preexec_fn=join)
    _assert_failed_on_limit(
        result.stderr, result.returncode, tmp_path, "cannot create another process or thread"
    )
    assert "RLIMIT_NPROC" in result.stderr and "pids.max" in result.stderr
