"""A terminal that closes under a running job, on a real pty (docs/explanation/faults.md):
closing the master side hangs the terminal up, as closing a terminal window or losing an ssh
session does.

- The launcher in the foreground (the pty is its session's controlling terminal): the
  kernel sends it SIGHUP, and the job stops as interrupted, exit 129, with its report.
- The launcher in the foreground under ``nohup`` (SIGHUP ignored, the console in
  nohup.out): the SIGHUP stays ignored and the job runs to its end, exit 0.
- The launcher disowned (another session; the pty only its stdout/stderr): no SIGHUP, its
  writes to the terminal fail with EIO; the job goes on without its console to its end,
  exit 0, with every line in the log files, the loss said once in the event log, and its
  report.json written.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from phalanx.events.log import read_events
from support.launch import PHALANX, wait_for, worker

HANG = 120.0  # bounds that only catch a hang


@contextlib.contextmanager
def _on_a_pty(
    argv: list[str], *, controlling: bool, cwd: Path | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``argv`` with a new pty as its stdin, stdout and stderr, in a session of its own;
    with ``controlling``, the pty is that session's controlling terminal (``setsid --ctty``
    execs in place: the launcher is the session leader). Yields (process, master fd); the
    session is killed afterwards if it is still running."""
    master, slave = os.openpty()
    try:
        launcher = subprocess.Popen(
            ["setsid", "--ctty", *argv] if controlling else argv,
            stdin=slave, stdout=slave, stderr=slave, start_new_session=not controlling, cwd=cwd,
        )  # fmt: skip
    finally:
        os.close(slave)
    try:
        yield launcher, master
    finally:
        with contextlib.suppress(OSError):
            os.close(master)
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(HANG)


def _read_some(master: int, until: bytes) -> bytes:
    """Read the terminal until ``until`` has appeared (so its buffer never fills)."""
    seen = bytearray()

    def arrived() -> bool:
        if select.select([master], [], [], 0.05)[0]:
            seen.extend(os.read(master, 65536))
        return until in seen

    wait_for(arrived, HANG, repr(until))
    return bytes(seen)


def _run_dir(logs: Path) -> Path:
    (run_dir,) = logs.iterdir()
    return run_dir


def _stdout_lines(logs: Path) -> list[str]:
    return (_run_dir(logs) / "attempt_0" / "rank_0" / "stdout.log").read_text().splitlines()


def test_a_foreground_job_whose_terminal_closes_stops_as_interrupted_by_sighup(
    tmp_path: Path,
) -> None:
    logs, flags = tmp_path / "logs", tmp_path / "flags"
    flags.mkdir()
    argv = [*PHALANX, "--log-dir", str(logs), worker("chatty_until_go.py"), str(flags)]
    with _on_a_pty(argv, controlling=True) as (launcher, master):
        _read_some(master, b"[rank0]: line 00001")
        os.close(master)  # hang up: the kernel sends SIGHUP to the session leader
        assert launcher.wait(HANG) == 129
    report = json.loads((_run_dir(logs) / "report.json").read_text())
    assert report["outcome"] == "interrupted" and report["signal"] == "SIGHUP", report
    events = read_events(_run_dir(logs) / "events.jsonl")
    ends = [(e["outcome"], e["exit_code"]) for e in events if e["kind"] == "job_end"]
    assert ends == [("interrupted", 129)]
    lines = _stdout_lines(logs)
    assert lines[:2] == ["line 00000", "line 00001"]
    assert lines == [f"line {n:05d}" for n in range(len(lines))]


def test_a_foreground_job_under_nohup_goes_on_when_its_terminal_closes(tmp_path: Path) -> None:
    logs, flags = tmp_path / "logs", tmp_path / "flags"
    flags.mkdir()
    argv = ["nohup", *PHALANX, "--log-dir", str(logs), worker("chatty_until_go.py"), str(flags)]
    with _on_a_pty(argv, controlling=True, cwd=tmp_path) as (launcher, master):
        console = tmp_path / "nohup.out"
        wait_for(
            lambda: console.exists() and "[rank0]: line 00001" in console.read_text(), HANG,
            "the first lines in nohup.out",
        )  # fmt: skip
        os.close(master)  # hang up: the kernel sends SIGHUP, which nohup ignores
        wait_for(
            lambda: "[rank0]: line 00100" in console.read_text(), HANG,
            "lines after the hangup",
        )  # fmt: skip
        (flags / "go").touch()
        assert launcher.wait(HANG) == 0, console.read_text()
    events = read_events(_run_dir(logs) / "events.jsonl")
    ends = [(e["outcome"], e["exit_code"]) for e in events if e["kind"] == "job_end"]
    assert ends == [("succeeded", 0)]
    lines = _stdout_lines(logs)
    assert lines[-1] == "done" and len(lines) > 101
    assert lines[:-1] == [f"line {n:05d}" for n in range(len(lines) - 1)]


def test_a_disowned_job_whose_terminal_closes_goes_on_without_its_console(
    tmp_path: Path,
) -> None:
    logs, flags = tmp_path / "logs", tmp_path / "flags"
    flags.mkdir()
    argv = [*PHALANX, "--log-dir", str(logs), worker("chatty_until_go.py"), str(flags)]
    with _on_a_pty(argv, controlling=False) as (launcher, master):
        _read_some(master, b"[rank0]: line 00001")
        os.close(master)  # hang up: its next write to the terminal fails with EIO
        events = lambda: read_events(_run_dir(logs) / "events.jsonl")  # noqa: E731
        wait_for(
            lambda: any(e["kind"] == "console_lost" for e in events()), HANG,
            "the lost console in the event log",
        )  # fmt: skip
        (flags / "go").touch()
        assert launcher.wait(HANG) == 0
    said = [e for e in events() if e["kind"] == "console_lost"]
    assert len(said) == 1 and "Input/output error" in said[0]["reason"], said
    ends = [(e["outcome"], e["exit_code"]) for e in events() if e["kind"] == "job_end"]
    assert ends == [("succeeded", 0)]
    # report.json is written at every end (it was not on a success without an incident).
    report = json.loads((_run_dir(logs) / "report.json").read_text())
    assert report["outcome"] == "succeeded" and report["root_cause"] is None, report
    assert [e["rank"] for e in report["exits"]] == [0], report
    lines = _stdout_lines(logs)
    assert lines[-1] == "done"
    assert lines[:-1] == [f"line {n:05d}" for n in range(len(lines) - 1)]
