"""Faults from outside the job, injected for real (README, "Faults from outside the job").

Each test makes the fault itself -- a full filesystem, a signal in the middle of the
rendezvous, an endpoint that does not resolve or does not answer -- and checks what the
README promises phalanx does about it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.net import free_port
from support.launch import PHALANX, alive, launched, run_phalanx, wait_for, worker

HANG = 60.0  # bounds that only catch a hang


@contextlib.contextmanager
def tiny_tmpfs(path: Path, size: str = "64k") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (root only), unmounted after."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True, timeout=30)  # fmt: skip
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True, timeout=30)


def test_a_full_log_disk_does_not_stop_a_healthy_job(tmp_path: Path) -> None:
    """200 KiB of output into a 64 KiB --log-dir: the log file fills, phalanx says so once,
    and the job goes on to its end with every line on the console."""
    with tiny_tmpfs(tmp_path / "logs") as logs:
        result = run_phalanx(["--log-dir", str(logs), worker("chatty.py"), "200"], timeout=HANG)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 200 and lines[-1].startswith("[rank0]: line 000199 ")
    said = [line for line in result.stderr.splitlines() if "No space left on device" in line]
    # Once per stream whose file filled (stdout's; stderr's finds the disk full too).
    assert len(said) == 2, result.stderr
    assert "rank_0/stdout.log" in said[0] and "rank_0/stderr.log" in said[1]
    assert "Traceback" not in result.stderr


def test_a_full_log_disk_still_gets_the_report_from_memory(tmp_path: Path) -> None:
    """A worker fails after the disk filled: the report still quotes its traceback (kept in
    memory), report.json that cannot be written is said in one line, and the exit code is
    the worker's."""
    with tiny_tmpfs(tmp_path / "logs") as logs:
        result = run_phalanx(
            ["--log-dir", str(logs), worker("chatty.py"), "200", "fail"], timeout=HANG
        )
    assert result.returncode == 1, result.stderr
    report = result.stderr[result.stderr.index("=" * 78) :]
    assert "RuntimeError: chatty failed after filling the disk" in report
    assert "report.json (No space left on device)" in result.stderr
    assert "Traceback (most recent call last)" in report  # the worker's, quoted
    assert result.stderr.count("phalanx: Traceback") == 0


def test_output_without_newlines_is_copied_in_pieces(tmp_path: Path) -> None:
    """10 MiB without a newline: the log file gets every byte, the console gets it in
    bounded pieces, each prefixed with the rank."""
    script = tmp_path / "noline.py"
    script.write_text("import sys\nsys.stdout.write('y' * (10 << 20))\nsys.stdout.flush()\n")
    result = run_phalanx(["--log-dir", str(tmp_path / "logs"), str(script)], timeout=HANG)
    assert result.returncode == 0, result.stderr
    pieces = result.stdout.splitlines()
    assert all(p.startswith("[rank0]: ") for p in pieces) and len(pieces) == 160
    assert sum(len(p) - len("[rank0]: ") for p in pieces) == 10 << 20
    (run_dir,) = (tmp_path / "logs").iterdir()
    assert (run_dir / "attempt_0" / "rank_0" / "stdout.log").stat().st_size == 10 << 20


def test_an_unwritable_log_dir_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("not a directory")
    done = subprocess.run(
        [*PHALANX, "--log-dir", str(blocker / "logs"), worker("chatty.py"), "1"],
        capture_output=True, text=True, timeout=HANG,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot make the run directory there" in lines[0], done.stderr
